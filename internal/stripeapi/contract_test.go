package stripeapi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/testtool"
)

// stripeMockURL starts Stripe's official stripe-mock (which validates every
// request against Stripe's OpenAPI spec) on a free loopback port and returns
// its URL. make test installs it and sets STRIPE_MOCK_BIN; a plain go test
// without it skips, except in CI, where it fails.
func stripeMockURL(t *testing.T) string {
	t.Helper()
	bin := testtool.Bin(t, "STRIPE_MOCK_BIN", "stripe-mock")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-http-addr", addr)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	url := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url + "/v1/customers/cus_x")
		if err == nil {
			resp.Body.Close()
			return url
		}
		if time.Now().After(deadline) {
			t.Fatalf("stripe-mock did not answer at %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStripeContract sends every request Tally makes to stripe-mock, which
// answers 400 to any parameter that Stripe's OpenAPI spec does not allow.
func TestStripeContract(t *testing.T) {
	t.Parallel()
	url := stripeMockURL(t)
	api := New(Config{APIKey: "sk_test_123", BaseURL: url, Timeout: 10 * time.Second})
	ctx := context.Background()

	t.Run("CustomerGet", func(t *testing.T) {
		cust, err := api.CustomerGet(ctx, "cus_123")
		require.NoError(t, err)
		require.NotEmpty(t, cust.ID)
	})

	t.Run("PaymentIntentCreate", func(t *testing.T) {
		for _, pm := range []*string{ptr("pm_card_visa"), nil} {
			c := &ledger.Charge{
				ID: 42, CustomerID: "acme", Period: "2026-11", AmountCents: 12345, Currency: "usd",
				StripeCustomerID: "cus_123", StripePaymentMethodID: pm,
				ChargeKey: ledger.ChargeKey("", "acme", "2026-11"), IdempotencyKey: ledger.ChargeIdempotencyKey("", "acme", "2026-11", 0),
			}
			pi, err := api.PaymentIntentCreate(ctx, PaymentIntentParams(c))
			require.NoError(t, err, fmt.Sprintf("payment method %v", pm))
			require.NotEmpty(t, pi.ID)
		}
	})

	t.Run("RejectsWhatStripeWould", func(t *testing.T) {
		// The check can fail: a parameter Stripe does not know is refused.
		c := &ledger.Charge{ID: 1, CustomerID: "acme", Period: "2026-11", AmountCents: 1, Currency: "usd",
			StripeCustomerID: "cus_123", ChargeKey: "k", IdempotencyKey: "k0"}
		params := PaymentIntentParams(c)
		params.AddExtra("tally_bogus", "1")
		_, err := api.PaymentIntentCreate(ctx, params)
		require.Error(t, err)
	})
}

func ptr[T any](v T) *T { return &v }
