package api

import (
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
)

// chargeResponse is a charge as the API shows it (and as notifications
// carry it).
type chargeResponse = ledger.PublicCharge

func newChargeResponse(c *ledger.Charge) chargeResponse { return c.Public() }

// handleChargeList lists charges newest first: ?status=, ?customer_id=,
// ?limit= (default 50, at most 500) and ?starting_after=<next_cursor>. A
// parameter that is not UTF-8, has control characters or is over 255 bytes
// is answered 422, naming it.
func handleChargeList(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type response struct {
		Data       []chargeResponse `json:"data"`
		HasMore    bool             `json:"has_more"`
		NextCursor *string          `json:"next_cursor"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := newQueryParams(r.URL)
		p := ledger.ChargeListParams{
			Status:     ledger.ChargeStatus(q.str("status")),
			CustomerID: q.str("customer_id"),
			Limit: int(q.integer("limit", 0, 1, ledger.ChargeListLimitMax,
				"must be a whole number between 1 and "+strconv.Itoa(ledger.ChargeListLimitMax))),
			AfterID: q.integer("starting_after", 0, 1, math.MaxInt64, "must be the next_cursor of a previous page"),
		}
		if err := q.err(); err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		charges, more, err := l.ChargeList(r.Context(), p)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := response{Data: make([]chargeResponse, 0, len(charges)), HasMore: more}
		for _, c := range charges {
			resp.Data = append(resp.Data, newChargeResponse(c))
		}
		if more {
			cursor := strconv.FormatInt(charges[len(charges)-1].ID, 10)
			resp.NextCursor = &cursor
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}

// pathID returns the request's {id}, or a *ledger.ValidationError when it
// is not a whole number: what names the kind of id ("charge").
func pathID(r *http.Request, what string) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return 0, &ledger.ValidationError{Fields: map[string]string{"id": "must be a " + what + " id, a whole number"}}
	}
	return id, nil
}

// operatorActionResponse is one operator action on a charge (approve,
// cancel, resolve) as the API shows it.
type operatorActionResponse struct {
	Action       string         `json:"action"`
	Actor        string         `json:"actor"`
	Reason       string         `json:"reason"`
	StatusBefore *string        `json:"status_before"`
	StatusAfter  *string        `json:"status_after"`
	Detail       map[string]any `json:"detail"`
	At           time.Time      `json:"at"`
}

func newOperatorActionResponse(a *ledger.OperatorAction) operatorActionResponse {
	detail := a.Detail
	if detail == nil {
		detail = map[string]any{}
	}
	return operatorActionResponse{
		Action: a.Action, Actor: a.Actor, Reason: a.Reason, StatusBefore: (*string)(a.StatusBefore),
		StatusAfter: (*string)(a.StatusAfter), Detail: detail, At: a.CreatedAt,
	}
}

// handleChargeGet returns one charge with every Stripe call made for it,
// every status change with who made it, every operator action on it
// (approve, cancel, resolve: who, why, the status before and after), and
// every refund and dispute of it with its current status, oldest first.
func handleChargeGet(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type attempt struct {
		Attempt               int        `json:"attempt"`
		KeyGeneration         int        `json:"key_generation"`
		StartedAt             time.Time  `json:"started_at"`
		FinishedAt            *time.Time `json:"finished_at"`
		Outcome               *string    `json:"outcome"`
		HTTPStatus            *int       `json:"http_status"`
		StripeRequestID       *string    `json:"stripe_request_id"`
		StripePaymentIntentID *string    `json:"stripe_payment_intent_id"`
		ErrorType             *string    `json:"error_type"`
		ErrorCode             *string    `json:"error_code"`
		ErrorMessage          *string    `json:"error_message"`
		RiverJobID            *int64     `json:"river_job_id"`
	}
	type transition struct {
		From   *string   `json:"from"`
		To     string    `json:"to"`
		Actor  string    `json:"actor"`
		Reason *string   `json:"reason"`
		At     time.Time `json:"at"`
	}
	type refund struct {
		StripeRefundID        string     `json:"stripe_refund_id"`
		Status                string     `json:"status"`
		AmountCents           int64      `json:"amount_cents"`
		Currency              string     `json:"currency"`
		Reason                *string    `json:"reason"`
		FailureReason         *string    `json:"failure_reason"`
		StripePaymentIntentID *string    `json:"stripe_payment_intent_id"`
		CreatedAt             time.Time  `json:"created_at"`
		StatusAt              *time.Time `json:"status_at"`
	}
	type dispute struct {
		StripeDisputeID   string     `json:"stripe_dispute_id"`
		Status            string     `json:"status"`
		AmountCents       int64      `json:"amount_cents"`
		Currency          string     `json:"currency"`
		Reason            *string    `json:"reason"`
		EvidenceDueBy     *time.Time `json:"evidence_due_by"`
		FundsWithdrawnAt  *time.Time `json:"funds_withdrawn_at"`
		FundsReinstatedAt *time.Time `json:"funds_reinstated_at"`
		CreatedAt         time.Time  `json:"created_at"`
		StatusAt          *time.Time `json:"status_at"`
	}
	type response struct {
		chargeResponse
		LineItems   []chargeLine             `json:"line_items"`
		Attempts    []attempt                `json:"attempts"`
		Transitions []transition             `json:"transitions"`
		Actions     []operatorActionResponse `json:"actions"`
		Refunds     []refund                 `json:"refunds"`
		Disputes    []dispute                `json:"disputes"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r, "charge")
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		c, err := l.ChargeGet(r.Context(), id)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		attempts, transitions, err := l.ChargeHistory(r.Context(), id)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		actions, err := l.ChargeActions(r.Context(), id)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		refunds, err := l.RefundListByCharge(r.Context(), id)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		disputes, err := l.DisputeListByCharge(r.Context(), id)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		lines, err := l.ChargeLines(r.Context(), id)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := response{chargeResponse: newChargeResponse(c), LineItems: make([]chargeLine, 0, len(lines)),
			Attempts: []attempt{}, Transitions: []transition{},
			Actions: make([]operatorActionResponse, 0, len(actions)), Refunds: make([]refund, 0, len(refunds)),
			Disputes: make([]dispute, 0, len(disputes))}
		for _, li := range lines {
			resp.LineItems = append(resp.LineItems, newChargeLine(li))
		}
		for _, a := range attempts {
			resp.Attempts = append(resp.Attempts, attempt{
				Attempt: a.Attempt, KeyGeneration: a.KeyGeneration, StartedAt: a.StartedAt, FinishedAt: a.FinishedAt,
				Outcome: a.Outcome, HTTPStatus: a.HTTPStatus, StripeRequestID: a.StripeRequestID,
				StripePaymentIntentID: a.StripePaymentIntentID, ErrorType: a.ErrorType, ErrorCode: a.ErrorCode,
				ErrorMessage: a.ErrorMessage, RiverJobID: a.RiverJobID,
			})
		}
		for _, t := range transitions {
			resp.Transitions = append(resp.Transitions, transition{From: t.FromStatus, To: t.ToStatus, Actor: t.Actor, Reason: t.Reason, At: t.CreatedAt})
		}
		for _, a := range actions {
			resp.Actions = append(resp.Actions, newOperatorActionResponse(a))
		}
		for _, f := range refunds {
			resp.Refunds = append(resp.Refunds, refund{
				StripeRefundID: f.StripeRefundID, Status: f.Status, AmountCents: f.AmountCents, Currency: f.Currency,
				Reason: f.Reason, FailureReason: f.FailureReason, StripePaymentIntentID: f.StripePaymentIntentID,
				CreatedAt: f.StripeCreatedAt, StatusAt: f.StatusObservedAt,
			})
		}
		for _, d := range disputes {
			resp.Disputes = append(resp.Disputes, dispute{
				StripeDisputeID: d.StripeDisputeID, Status: d.Status, AmountCents: d.AmountCents, Currency: d.Currency,
				Reason: d.Reason, EvidenceDueBy: d.EvidenceDueBy, FundsWithdrawnAt: d.FundsWithdrawnAt,
				FundsReinstatedAt: d.FundsReinstatedAt, CreatedAt: d.StripeCreatedAt, StatusAt: d.StatusObservedAt,
			})
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}

// chargeLine is one line of a charge as GET /v1/charges/{id} shows it:
// decimals as strings, exact; a usage line's rating beside its amount.
type chargeLine struct {
	Line           int32            `json:"line"`
	Kind           string           `json:"kind"`
	EventCount     int64            `json:"event_count"`
	ExactAmount    string           `json:"exact_amount"`
	AmountCents    int64            `json:"amount_cents"`
	Metric         string           `json:"metric,omitempty"`
	PlanID         string           `json:"plan_id,omitempty"`
	PlanVersion    int32            `json:"plan_version,omitempty"`
	Model          string           `json:"model,omitempty"`
	Quantity       string           `json:"quantity,omitempty"`
	Tiers          []chargeLineTier `json:"tiers,omitempty"`
	Packages       string           `json:"packages,omitempty"`
	Subtotal       string           `json:"subtotal,omitempty"`
	MinimumApplied *bool            `json:"minimum_applied,omitempty"`
	GrantID        string           `json:"grant_id,omitempty"`
}

// chargeLineTier is one tier of a usage line: the tier's number in the price
// (from 1), the units priced in it, its unit and flat amounts and what it
// comes to, exact.
type chargeLineTier struct {
	Tier       int    `json:"tier"`
	Quantity   string `json:"quantity"`
	UnitAmount string `json:"unit_amount"`
	FlatAmount string `json:"flat_amount"`
	Amount     string `json:"amount"`
}

func newChargeLine(li ledger.ChargeLine) chargeLine {
	out := chargeLine{Line: li.Line, Kind: string(li.Kind), EventCount: li.EventCount,
		ExactAmount: li.ExactAmount.Text('f'), AmountCents: li.AmountCents, GrantID: li.GrantID}
	u := li.Usage
	if u == nil {
		return out
	}
	r := u.Rated
	out.Metric, out.PlanID, out.PlanVersion, out.Model = u.Metric, u.PlanID, u.PlanVersion, string(r.Model)
	out.Quantity, out.Subtotal, out.MinimumApplied = r.Quantity.Text('f'), r.Subtotal.Text('f'), &r.MinimumApplied
	if r.Model == pricing.ModelPackage {
		out.Packages = r.Packages.Text('f')
	}
	for _, t := range r.Tiers {
		out.Tiers = append(out.Tiers, chargeLineTier{Tier: t.Tier + 1, Quantity: t.Quantity.Text('f'),
			UnitAmount: t.UnitAmount.Text('f'), FlatAmount: t.FlatAmount.Text('f'), Amount: t.Amount.Text('f')})
	}
	return out
}
