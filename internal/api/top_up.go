package api

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
)

// topUpsLimitMax bounds a page of top-ups.
const topUpsLimitMax = 100

// handleTopUpCreate buys credits (admin): 201 with the pending top-up, whose
// job then charges it once; 200 with it when the same top_up_id was bought
// on the same terms already (a replay, whatever its status now); 409
// top_up_id_reused when it holds other terms.
func handleTopUpCreate(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type request struct {
		TopUpID        string     `json:"top_up_id"`
		AmountCents    int64      `json:"amount_cents"`
		Currency       string     `json:"currency"`
		Category       string     `json:"category"`
		Priority       *int32     `json:"priority"`
		GrantExpiresAt *time.Time `json:"grant_expires_at"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		t, created, err := l.TopUpCreate(r.Context(), ledger.TopUpParams{
			CustomerID: r.PathValue("customer_id"), TopUpID: req.TopUpID, AmountCents: req.AmountCents,
			Currency: req.Currency, Category: ledger.CreditCategory(req.Category), Priority: req.Priority,
			GrantExpiresAt: req.GrantExpiresAt, Actor: actorFrom(r),
		})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, createdOrOK(created), t.Public())
	})
}

// handleTopUpGet returns one top-up, or 404.
func handleTopUpGet(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, err := l.TopUpGet(r.Context(), r.PathValue("customer_id"), r.PathValue("top_up_id"))
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusOK, t.Public())
	})
}

// handleTopUpList returns a customer's top-ups, newest first, a page at a
// time (?limit=, default 50, at most 100; ?starting_after=<top_up_id>).
func handleTopUpList(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type response struct {
		Data       []ledger.PublicTopUp `json:"data"`
		HasMore    bool                 `json:"has_more"`
		NextCursor *string              `json:"next_cursor"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := newQueryParams(r.URL)
		p := ledger.TopUpListParams{CustomerID: r.PathValue("customer_id"), StartingAfter: q.str("starting_after"),
			Limit: int(q.integer("limit", 50, 1, topUpsLimitMax, "must be a whole number between 1 and "+strconv.Itoa(topUpsLimitMax)))}
		if err := q.err(); err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		ts, more, err := l.TopUpList(r.Context(), p)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := response{Data: make([]ledger.PublicTopUp, len(ts)), HasMore: more}
		for i, t := range ts {
			resp.Data[i] = t.Public()
		}
		if more {
			resp.NextCursor = &ts[len(ts)-1].TopUpID
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}

// handleTopUpCancel cancels a held top-up, or a pending one never sent to
// Stripe (admin): 200 with it (also when it was canceled already), 409
// top_up_not_cancelable otherwise.
func handleTopUpCancel(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type request struct {
		Reason string `json:"reason"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		t, changed, err := l.TopUpCancel(r.Context(), ledger.TopUpCancelParams{CustomerID: r.PathValue("customer_id"),
			TopUpID: r.PathValue("top_up_id"), Reason: req.Reason, Actor: actorFrom(r)})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		if changed {
			logger.WarnContext(r.Context(), "top-up canceled by an operator", slog.String("customer_id", t.CustomerID),
				slog.String("top_up_id", t.TopUpID), slog.String("actor", actorFrom(r)))
		}
		httpjson.Encode(w, http.StatusOK, t.Public())
	})
}
