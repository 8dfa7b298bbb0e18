package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"github.com/tally-billing/tally/internal/stripesim"
)

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("BadFlag", func(t *testing.T) {
		t.Parallel()

		err := run(context.Background(), []string{"stripesim", "--nope"}, func(string) string { return "" }, io.Discard, io.Discard)
		require.Error(t, err)
		err = run(context.Background(), []string{"stripesim", "--log-level", "loud"}, func(string) string { return "" }, io.Discard, io.Discard)
		require.ErrorContains(t, err, "log-level")
	})

	t.Run("ServesUntilCanceled", func(t *testing.T) {
		t.Parallel()

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stdoutR, stdoutW := io.Pipe()
		env := map[string]string{"STRIPESIM_WEBHOOK_SECRET": "whsec_cmd_test"}
		runErr := make(chan error, 1)
		go func() {
			runErr <- run(ctx, []string{"stripesim", "--addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, stdoutW, io.Discard)
			_ = stdoutW.Close()
		}()

		line, err := bufio.NewReader(stdoutR).ReadString('\n')
		require.NoError(t, err)
		go func() { _, _ = io.Copy(io.Discard, stdoutR) }()
		baseURL, ok := strings.CutPrefix(strings.TrimSpace(line), "stripesim listening on ")
		require.True(t, ok, line)
		require.True(t, strings.HasPrefix(baseURL, "http://127.0.0.1:"), baseURL)

		control := &stripesim.ControlClient{BaseURL: baseURL}
		require.NoError(t, control.Health(ctx))
		require.NoError(t, control.FaultAdd(ctx, stripesim.Fault{Customer: "cus_a", Kind: stripesim.FaultKindDecline, Count: 1}))

		backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
			URL:               stripe.String(baseURL),
			MaxNetworkRetries: stripe.Int64(0),
			HTTPClient:        &http.Client{Timeout: time.Minute},
			LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		})
		api := &client.API{}
		api.Init("sk_test_x", &stripe.Backends{API: backend, Connect: backend, Uploads: backend})

		params := &stripe.PaymentIntentParams{
			Amount:     stripe.Int64(1500),
			Currency:   stripe.String("usd"),
			Customer:   stripe.String("cus_a"),
			Confirm:    stripe.Bool(true),
			OffSession: stripe.Bool(true),
		}
		params.SetIdempotencyKey("cmd-k1")
		_, err = api.PaymentIntents.New(params)
		var stripeErr *stripe.Error
		require.ErrorAs(t, err, &stripeErr)
		require.Equal(t, stripe.ErrorCodeCardDeclined, stripeErr.Code)

		params.SetIdempotencyKey("cmd-k2")
		pi, err := api.PaymentIntents.New(params)
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)

		all, err := control.PaymentIntentList(ctx)
		require.NoError(t, err)
		require.Len(t, all, 2)

		cancel()
		require.NoError(t, <-runErr)
	})
}
