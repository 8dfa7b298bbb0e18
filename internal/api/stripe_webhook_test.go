package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76/webhook"
)

func TestStripeWebhook(t *testing.T) {
	t.Parallel()

	const secret = "whsec_test"

	// post signs payload with secret at t and posts it.
	post := func(h http.Handler, payload, secret string, at time.Time) *httptest.ResponseRecorder {
		signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: []byte(payload), Secret: secret, Timestamp: at})
		req := httptest.NewRequest(http.MethodPost, "/v1/stripe/webhooks", strings.NewReader(payload))
		req.Header.Set("Stripe-Signature", signed.Header)
		req.Header.Set("Content-Type", "application/json") // as Stripe sends it
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	t.Run("BadSignature", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		h := newServer(t, b.Logger, b.Ledger, func(context.Context) error { return nil }, secret)
		payload := `{"id":"evt_1","type":"payment_intent.succeeded","created":1700000000}`
		requireProblem(t, post(h, payload, "whsec_other", time.Now()), http.StatusBadRequest, "invalid_signature")
		requireProblem(t, post(h, payload, secret, time.Now().Add(-301*time.Second)), http.StatusBadRequest, "invalid_signature")
		require.Zero(t, b.Count(t, "SELECT count(*) FROM billing.stripe_events"))
	})

	// Signed events that Postgres cannot store (each was a 500, retried by
	// Stripe for three days) are 400 invalid_event, and nothing is stored.
	t.Run("SignedButNotStorable", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		h := newServer(t, b.Logger, b.Ledger, func(context.Context) error { return nil }, secret)
		for _, payload := range []string{
			"{\"id\":\"evt_\xff\",\"type\":\"x\",\"created\":1}",
			"{\"id\":\"evt_1\",\"type\":\"x\",\"created\":1,\"data\":{\"object\":{\"name\":\"\xc3\"}}}",
			`{"id":"\u0000","type":"x","created":1}`,
			`{"id":"","type":"x","created":1}`,
			`{"id":"evt_a` + "\\n" + `b","type":"x","created":1}`,
			`{"id":"evt_` + strings.Repeat("x", 300) + `","type":"x","created":1}`,
			`{"id":"evt_1","type":"","created":1}`,
			`{"id":"evt_1","type":"x","created":9223372036854775807}`,
			`{"id":"evt_1","type":"x","created":-1}`,
			`{"id":"evt_1","type":"x","created":1,"data":{"object":{"note":"\u0000"}}}`,
			`{"id":"evt_1","type":"x","created":1,"data":{"object":{"\u0000":1}}}`,
			`{"id":"evt_1","type":"x","created":1,"data":{"object":{"amount":1e1000000}}}`,
			`{"id":"evt_1","type":"x","created":1,"data":{"object":{"amount":0e-20000}}}`,
			`[]`,
		} {
			requireProblem(t, post(h, payload, secret, time.Now()), http.StatusBadRequest, "invalid_event")
		}
		require.Zero(t, b.Count(t, "SELECT count(*) FROM billing.stripe_events"))
	})

	t.Run("Stores", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		h := newServer(t, b.Logger, b.Ledger, func(context.Context) error { return nil }, secret)
		payload := `{"id":"evt_1","object":"event","type":"payment_intent.succeeded","created":1700000000,"data":{"object":{"id":"pi_1","amount":1e-400,"note":"é"}}}`
		rec := post(h, payload, secret, time.Now())
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.JSONEq(t, `{"received":true,"replay":false}`, rec.Body.String())
		rec = post(h, payload, secret, time.Now())
		require.JSONEq(t, `{"received":true,"replay":true}`, rec.Body.String())
		require.Equal(t, int64(1), b.Count(t, "SELECT count(*) FROM billing.stripe_events"))
	})
}
