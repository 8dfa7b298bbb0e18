package api

import (
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
)

type creditGrantResponse = ledger.PublicCreditGrant

func newCreditGrantResponse(g *ledger.CreditGrant) creditGrantResponse { return g.Public() }

// creditEntryResponse is an entry of a grant as the API shows it.
type creditEntryResponse struct {
	ID          int64     `json:"id"`
	GrantID     string    `json:"grant_id"`
	Kind        string    `json:"kind"`
	AmountCents int64     `json:"amount_cents"`
	ChargeID    *int64    `json:"charge_id"`
	Reason      *string   `json:"reason"`
	Actor       string    `json:"actor"`
	CreatedAt   time.Time `json:"created_at"`
}

func newCreditEntryResponse(e *ledger.CreditEntry) creditEntryResponse {
	return creditEntryResponse{ID: e.ID, GrantID: e.GrantID, Kind: string(e.Kind), AmountCents: e.AmountCents,
		ChargeID: e.ChargeID, Reason: e.Reason, Actor: e.Actor, CreatedAt: e.CreatedAt}
}

// handleCreditGrantCreate grants credits (admin): 201 with the grant, 200
// with it when the same grant_id was granted the same terms already (a
// replay), 409 grant_id_reused when it holds other terms.
func handleCreditGrantCreate(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type request struct {
		GrantID     string     `json:"grant_id"`
		AmountCents int64      `json:"amount_cents"`
		Currency    string     `json:"currency"`
		Category    string     `json:"category"`
		Priority    *int32     `json:"priority"`
		ExpiresAt   *time.Time `json:"expires_at"`
		Metrics     []string   `json:"metrics"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		g, created, err := l.CreditGrantCreate(r.Context(), ledger.CreditGrantParams{
			CustomerID: r.PathValue("customer_id"), GrantID: req.GrantID, AmountCents: req.AmountCents,
			Currency: req.Currency, Category: ledger.CreditCategory(req.Category), Priority: req.Priority,
			ExpiresAt: req.ExpiresAt, Metrics: req.Metrics, Actor: actorFrom(r),
		})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, createdOrOK(created), newCreditGrantResponse(g))
	})
}

// handleCreditGrantVoid voids what is left of a grant (admin): 201 with the
// voided entry, 200 with it when the grant was voided already, 409
// grant_exhausted when nothing is left.
func handleCreditGrantVoid(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type request struct {
		Reason string `json:"reason"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		e, created, err := l.CreditGrantVoid(r.Context(), ledger.CreditGrantVoidParams{
			CustomerID: r.PathValue("customer_id"), GrantID: r.PathValue("grant_id"), Reason: req.Reason, Actor: actorFrom(r),
		})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, createdOrOK(created), newCreditEntryResponse(e))
	})
}

// handleCustomerCredits returns a customer's credits: balances per currency
// and category, every grant, and the entries a page at a time
// (?limit=, default 100, at most 500; ?starting_after=<next_cursor>).
func handleCustomerCredits(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type balance struct {
		Currency       string `json:"currency"`
		Category       string `json:"category"`
		RemainingCents int64  `json:"remaining_cents"`
	}
	type response struct {
		CustomerID string                `json:"customer_id"`
		Balances   []balance             `json:"balances"`
		Grants     []creditGrantResponse `json:"grants"`
		Entries    []creditEntryResponse `json:"entries"`
		HasMore    bool                  `json:"has_more"`
		NextCursor *string               `json:"next_cursor"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := newQueryParams(r.URL)
		p := ledger.CreditsParams{
			CustomerID: r.PathValue("customer_id"),
			EntriesAfter: q.integer("starting_after", 0, 0, math.MaxInt64,
				"must be the next_cursor of the previous page"),
			EntriesLimit: int(q.integer("limit", 0, 1, ledger.CreditEntriesLimitMax,
				"must be a whole number between 1 and "+strconv.Itoa(ledger.CreditEntriesLimitMax))),
		}
		if err := q.err(); err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		c, err := l.CustomerCredits(r.Context(), p)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := response{CustomerID: p.CustomerID, Balances: make([]balance, len(c.Balances)),
			Grants: make([]creditGrantResponse, len(c.Grants)), Entries: make([]creditEntryResponse, len(c.Entries)),
			HasMore: c.EntriesMore}
		for i, b := range c.Balances {
			resp.Balances[i] = balance{Currency: b.Currency, Category: string(b.Category), RemainingCents: b.RemainingCents}
		}
		for i, g := range c.Grants {
			resp.Grants[i] = newCreditGrantResponse(g)
		}
		for i, e := range c.Entries {
			resp.Entries[i] = newCreditEntryResponse(e)
		}
		if c.EntriesMore {
			cursor := strconv.FormatInt(c.Entries[len(c.Entries)-1].ID, 10)
			resp.NextCursor = &cursor
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}
