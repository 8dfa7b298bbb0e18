package stripeapi_test

import (
	"context"
	"io"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/metrics"
	"github.com/tally-billing/tally/internal/stripeapi"
	"github.com/tally-billing/tally/internal/stripesim"
)

// Every call through the Client is counted by operation and outcome, with
// its duration (tally_stripe_requests_total, tally_stripe_request_duration_seconds).
func TestClientMetrics(t *testing.T) {
	ctx := context.Background()
	sim := stripesim.New(stripesim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	m := metrics.New()
	api := stripeapi.New(stripeapi.Config{APIKey: "sk_test_tally", BaseURL: srv.URL, Metrics: m})

	create := func(key string) error {
		params := &stripe.PaymentIntentParams{
			Amount: stripe.Int64(500), Currency: stripe.String("usd"), Customer: stripe.String("cus_metrics"),
			PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true),
		}
		params.SetIdempotencyKey(key)
		_, err := api.PaymentIntentCreate(ctx, params)
		return err
	}
	require.NoError(t, create("k1"))
	require.NoError(t, sim.FaultAdd(stripesim.Fault{Customer: "cus_metrics", Kind: stripesim.FaultKindError500BeforeCreate, Count: 1}))
	require.Error(t, create("k2"))
	_, err := api.CustomerGet(ctx, "cus_metrics")
	require.NoError(t, err)

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, err := io.ReadAll(rec.Body)
	require.NoError(t, err)
	text := string(body)
	require.Contains(t, text, `tally_stripe_requests_total{operation="payment_intent_create",outcome="ok"} 1`)
	require.Contains(t, text, `tally_stripe_requests_total{operation="payment_intent_create",outcome="server_error"} 1`)
	require.Contains(t, text, `tally_stripe_requests_total{operation="customer_get",outcome="ok"} 1`)
	require.Contains(t, text, `tally_stripe_request_duration_seconds_count{operation="payment_intent_create"} 2`)
}
