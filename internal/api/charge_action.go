package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
)

// Operator actions on a charge (admin): the ways out of a hold. Each takes a
// required reason, is recorded with the calling key as its actor
// (actorFrom), and shows up in GET /v1/charges/{id} under "actions". The
// ledger decides what is allowed; its refusals are 409 with a stable code
// (charge_not_held, charge_outcome_unknown, charge_leased,
// charge_not_cancelable, charge_not_past_due), 422 for a missing or overlong reason, 404 for an
// unknown charge.

// handleChargeApprove approves a held charge (ledger.ChargeApprove): it
// moves to pending with its guards waived, looks at Stripe before its next
// call, and its charge job runs now. 200 with the charge.
func handleChargeApprove(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return handleChargeAction(logger, l.ChargeApprove)
}

// handleChargeCancel cancels a held or pending charge for which no money can
// have moved (ledger.ChargeCancel). 200 with the charge.
func handleChargeCancel(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return handleChargeAction(logger, l.ChargeCancel)
}

// handleChargeRetry retries a past_due charge now (ledger.ChargeRetryNow),
// for a producer whose customer updated their payment method: its charge job
// runs now, cancels the declined PaymentIntent and calls Stripe with the next
// key and the customer's current payment method. The body ({"reason"}) may
// be left out. 200 with the charge, still past_due until the job runs.
func handleChargeRetry(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	action := handleChargeAction(logger, l.ChargeRetryNow)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 {
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader("{}")), 2
			r.Header.Set("Content-Type", "application/json")
		}
		action.ServeHTTP(w, r)
	})
}

// handleChargeAction decodes {"reason"}, runs act on the charge {id} as the
// calling key, and answers 200 with the charge as act left it.
func handleChargeAction(logger *slog.Logger, act func(context.Context, ledger.ChargeActionParams) (*ledger.Charge, error)) http.Handler {
	type request struct {
		Reason string `json:"reason"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, req, err := chargeActionRequest[request](w, r)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		c, err := act(r.Context(), ledger.ChargeActionParams{ChargeID: id, Actor: actorFrom(r), Reason: req.Reason})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusOK, newChargeResponse(c))
	})
}

// chargeActionRequest reads the request of an operator action on a charge:
// the charge {id}, then the body decoded as a T (decode, at most
// httpjson.BodyLimitDefault bytes). It returns the first error, for writeError.
func chargeActionRequest[T any](w http.ResponseWriter, r *http.Request) (int64, T, error) {
	id, err := pathID(r, "charge")
	if err != nil {
		var zero T
		return 0, zero, err
	}
	req, err := httpjson.Decode[T](w, r, httpjson.BodyLimitDefault)
	return id, req, err
}

// handleChargeResolve requests the resolve of a charge held for a double
// charge or a mismatching PaymentIntent (ledger.ChargeResolveRequest): keep
// one PaymentIntent, refund every other one carrying the charge's key. The
// work is a River job on the charges queue, so the answer is 202 Accepted
// with the charge, still held, and a Location to watch it at; the charge
// turns succeeded once the job has refunded and settled (it waits while
// charging is paused).
func handleChargeResolve(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type request struct {
		KeepPaymentIntent string `json:"keep_payment_intent"`
		Reason            string `json:"reason"`
	}
	type response struct {
		Charge            chargeResponse `json:"charge"`
		KeepPaymentIntent string         `json:"keep_payment_intent"`
		Note              string         `json:"note"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, req, err := chargeActionRequest[request](w, r)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		c, err := l.ChargeResolveRequest(r.Context(), ledger.ChargeResolveRequestParams{
			ChargeActionParams: ledger.ChargeActionParams{ChargeID: id, Actor: actorFrom(r), Reason: req.Reason},
			KeepPaymentIntent:  req.KeepPaymentIntent,
		})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		location := "/v1/charges/" + strconv.FormatInt(c.ID, 10)
		w.Header().Set("Location", location)
		httpjson.Encode(w, http.StatusAccepted, response{
			Charge:            newChargeResponse(c),
			KeepPaymentIntent: req.KeepPaymentIntent,
			Note: "the resolve job refunds every other succeeded PaymentIntent carrying the charge's key, then settles the charge as succeeded with " +
				req.KeepPaymentIntent + "; until then it stays held (it waits while charging is paused); follow it at GET " + location,
		})
	})
}
