package api

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/tally-billing/tally/internal/ledger"
)

// bodyLimitWebhook bounds a Stripe event payload.
const bodyLimitWebhook = 1 << 20

// handleStripeWebhook receives Stripe events: it verifies Stripe-Signature
// with the endpoint secret (300 s tolerance), stores the event by its id with
// its processing job in one transaction, and answers 200 at once. A replayed
// event id answers 200 and stores nothing. A bad or stale signature answers
// 400 and stores nothing. Without a secret configured every event is refused
// with 503, so Stripe keeps retrying until one is set.
func handleStripeWebhook(logger *slog.Logger, l *ledger.Ledger, secret string) http.Handler {
	type response struct {
		Received bool `json:"received"`
		Replay   bool `json:"replay"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if secret == "" {
			writeProblem(w, r, problem{Status: http.StatusServiceUnavailable, Code: "webhooks_disabled",
				Detail: "this Tally has no STRIPE_WEBHOOK_SECRET; set it to the endpoint's signing secret (whsec_…)"})
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, bodyLimitWebhook))
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			writeError(logger, w, r, jsonError(err, bodyLimitWebhook, ""))
			return
		}
		if err != nil {
			writeProblem(w, r, problem{Status: http.StatusBadRequest, Code: "malformed_body", Detail: "the body could not be read"})
			return
		}
		event, err := webhook.ConstructEventWithOptions(body, r.Header.Get("Stripe-Signature"), secret,
			webhook.ConstructEventOptions{Tolerance: webhook.DefaultTolerance, IgnoreAPIVersionMismatch: true})
		if err != nil {
			logger.WarnContext(r.Context(), "stripe webhook refused", slog.String("error", err.Error()),
				slog.String("request_id", requestIDFrom(r.Context())))
			writeProblem(w, r, problem{Status: http.StatusBadRequest, Code: "invalid_signature",
				Detail: "the Stripe-Signature header does not verify with this endpoint's secret, or is older than 300 s"})
			return
		}
		created, err := l.StripeEventRecord(r.Context(), ledger.StripeEventParams{
			ID: event.ID, Type: string(event.Type), Payload: body, Livemode: event.Livemode,
			CreatedAt: time.Unix(event.Created, 0).UTC(),
		})
		if err != nil {
			writeInternal(logger, w, r, err)
			return
		}
		encode(w, http.StatusOK, response{Received: true, Replay: !created})
	})
}
