package stripesim

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

// testBaseTime is the fixed base clock of tests that need deterministic "created" values.
var testBaseTime = time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC)

type testBundle struct {
	api    *client.API // stripe-go pointed at the simulator
	sim    *Server
	server *httptest.Server
}

// testSetupOpts tweaks setup.
type testSetupOpts struct {
	config Config
	// httpClient is the stripe-go HTTP client; nil means a fresh client without keep-alives,
	// so a dropped connection surfaces as an error instead of being retried transparently by
	// net/http (which replays requests carrying an Idempotency-Key on reused connections).
	httpClient *http.Client
}

func setup(t *testing.T, opts *testSetupOpts) *testBundle {
	t.Helper()
	if opts == nil {
		opts = &testSetupOpts{}
	}
	cfg := opts.config
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	sim := New(cfg)
	server := httptest.NewServer(sim) // binds 127.0.0.1
	t.Cleanup(server.Close)
	t.Cleanup(sim.Close)

	httpClient := opts.httpClient
	if httpClient == nil {
		httpClient = &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
	}
	return &testBundle{
		api:    newStripeClient(server.URL, "sk_test_x", httpClient),
		sim:    sim,
		server: server,
	}
}

// newStripeClient returns the real stripe-go client, without retries, pointed at baseURL.
func newStripeClient(baseURL, key string, httpClient *http.Client) *client.API {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(baseURL),
		MaxNetworkRetries: stripe.Int64(0),
		HTTPClient:        httpClient,
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		EnableTelemetry:   stripe.Bool(false),
	})
	api := &client.API{}
	api.Init(key, &stripe.Backends{API: backend, Connect: backend, Uploads: backend})
	return api
}

// chargeParams are the parameters Tally's charge job sends, with an idempotency key.
func chargeParams(ctx context.Context, customerID string, amount int64, key string) *stripe.PaymentIntentParams {
	params := &stripe.PaymentIntentParams{
		Amount:      stripe.Int64(amount),
		Confirm:     stripe.Bool(true),
		Currency:    stripe.String("usd"),
		Customer:    stripe.String(customerID),
		Description: stripe.String("Tally usage " + customerID),
		OffSession:  stripe.Bool(true),
	}
	params.Context = ctx
	params.AddMetadata("tally_charge_key", "charge-key-"+key)
	params.AddMetadata("period", "2026-11")
	if key != "" {
		params.SetIdempotencyKey(key)
	}
	return params
}

// requireStripeError asserts err is a *stripe.Error with the status, type and code.
func requireStripeError(t *testing.T, err error, status int, errType stripe.ErrorType, code stripe.ErrorCode) *stripe.Error {
	t.Helper()
	require.Error(t, err)
	var stripeErr *stripe.Error
	require.ErrorAs(t, err, &stripeErr, "want a *stripe.Error, got %T: %v", err, err)
	require.Equal(t, status, stripeErr.HTTPStatusCode, "error: %v", err)
	require.Equal(t, errType, stripeErr.Type, "error: %v", err)
	require.Equal(t, code, stripeErr.Code, "error: %v", err)
	require.True(t, strings.HasPrefix(stripeErr.RequestID, "req_"), "request id %q", stripeErr.RequestID)
	return stripeErr
}

func TestServer(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	t.Run("APIKeyInvalid", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		api := newStripeClient(bundle.server.URL, "pk_test_x", nil)
		_, err := api.PaymentIntents.New(chargeParams(ctx, "cus_a", 100, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusUnauthorized, stripe.ErrorTypeInvalidRequest, "")
		require.Contains(t, stripeErr.Msg, "Invalid API Key")
		require.Empty(t, bundle.sim.PaymentIntentList())
	})

	t.Run("APIKeyMissing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		req, err := http.NewRequestWithContext(ctx, http.MethodGet, bundle.server.URL+"/v1/customers/cus_a", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		require.Contains(t, string(body), "You did not provide an API key")
		require.True(t, strings.HasPrefix(resp.Header.Get("Request-Id"), "req_"))

		api := newStripeClient(bundle.server.URL, "", nil)
		_, err = api.Customers.Get("cus_a", nil)
		_ = requireStripeError(t, err, http.StatusUnauthorized, stripe.ErrorTypeInvalidRequest, "")
		require.Empty(t, bundle.sim.PaymentIntentList())
		require.Equal(t, 2, bundle.sim.Stats().Requests["GET /v1/customers/{id}"]["unauthorized"])
	})

	t.Run("CreateExplicitPaymentMethod", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		params := chargeParams(ctx, "cus_a", 500, "k1")
		params.PaymentMethod = stripe.String("pm_card_mastercard")
		pi, err := bundle.api.PaymentIntents.New(params)
		require.NoError(t, err)
		require.Equal(t, "pm_card_mastercard", pi.PaymentMethod.ID)
	})

	t.Run("CreateSucceeds", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, &testSetupOpts{config: Config{Now: func() time.Time { return testBaseTime }}})

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1234, "k1"))
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(pi.ID, "pi_"), pi.ID)
		require.Equal(t, "payment_intent", pi.Object)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
		require.Equal(t, int64(1234), pi.Amount)
		require.Equal(t, int64(1234), pi.AmountReceived)
		require.Equal(t, stripe.Currency("usd"), pi.Currency)
		require.Equal(t, "cus_a", pi.Customer.ID)
		require.Equal(t, PaymentMethodDefault, pi.PaymentMethod.ID) // the customer's default
		require.NotNil(t, pi.LatestCharge)
		require.True(t, strings.HasPrefix(pi.LatestCharge.ID, "ch_"), pi.LatestCharge.ID)
		require.Equal(t, testBaseTime.Unix(), pi.Created)
		require.False(t, pi.Livemode)
		require.Equal(t, "charge-key-k1", pi.Metadata["tally_charge_key"])
		require.Equal(t, "2026-11", pi.Metadata["period"])
		require.Equal(t, "Tally usage cus_a", pi.Description)
		require.True(t, strings.HasPrefix(pi.LastResponse.RequestID, "req_"))
		require.Equal(t, "k1", pi.LastResponse.IdempotencyKey)
		require.Empty(t, pi.LastResponse.Header.Get("Idempotent-Replayed"))

		all := bundle.sim.PaymentIntentList()
		require.Len(t, all, 1)
		require.Equal(t, pi.ID, all[0].ID)
		require.Equal(t, 1, bundle.sim.Stats().Requests["POST /v1/payment_intents"]["succeeded"])
		require.Equal(t, 1, bundle.sim.Stats().PaymentIntentsCreated)
	})

	t.Run("CreateValidation", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		for _, tt := range []struct {
			name   string
			mutate func(*stripe.PaymentIntentParams)
			code   stripe.ErrorCode
			param  string
		}{
			{"AmountMissing", func(p *stripe.PaymentIntentParams) { p.Amount = nil }, "parameter_missing", "amount"},
			{"AmountZero", func(p *stripe.PaymentIntentParams) { p.Amount = stripe.Int64(0) }, "amount_too_small", "amount"},
			{"AmountTooLarge", func(p *stripe.PaymentIntentParams) { p.Amount = stripe.Int64(100_000_000) }, "amount_too_large", "amount"},
			{"CurrencyInvalid", func(p *stripe.PaymentIntentParams) { p.Currency = stripe.String("dollars") }, "", "currency"},
			{"CustomerUnknown", func(p *stripe.PaymentIntentParams) { p.Customer = stripe.String("acct_1") }, "resource_missing", "customer"},
			{"OffSessionWithoutConfirm", func(p *stripe.PaymentIntentParams) { p.Confirm = stripe.Bool(false) }, "", "off_session"},
			{"PaymentMethodUnknown", func(p *stripe.PaymentIntentParams) { p.PaymentMethod = stripe.String("visa") }, "resource_missing", "payment_method"},
		} {
			params := chargeParams(ctx, "cus_a", 100, "key-"+tt.name)
			tt.mutate(params)
			_, err := bundle.api.PaymentIntents.New(params)
			stripeErr := requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, tt.code)
			require.Equal(t, tt.param, stripeErr.Param, tt.name)

			// Validation errors are not stored: the same key with valid parameters works.
			pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 100, "key-"+tt.name))
			require.NoError(t, err, tt.name)
			require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
		}
		require.Len(t, bundle.sim.PaymentIntentList(), 7)
	})

	t.Run("CreateWithoutConfirm", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindDecline}))
		pi, err := bundle.api.PaymentIntents.New(&stripe.PaymentIntentParams{
			Amount:   stripe.Int64(500),
			Currency: stripe.String("EUR"),
			Customer: stripe.String("cus_a"),
		})
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusRequiresConfirmation, pi.Status)
		require.Equal(t, stripe.Currency("eur"), pi.Currency)
		require.Nil(t, pi.LatestCharge)
		require.Len(t, bundle.sim.FaultList(), 1, "a confirm-only fault is not consumed by confirm=false")
	})

	t.Run("Retrieve", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		created, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 100, "k1"))
		require.NoError(t, err)
		got, err := bundle.api.PaymentIntents.Get(created.ID, nil)
		require.NoError(t, err)
		require.Equal(t, created.ID, got.ID)
		require.Equal(t, created.LatestCharge.ID, got.LatestCharge.ID)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, got.Status)

		_, err = bundle.api.PaymentIntents.Get("pi_missing", nil)
		stripeErr := requireStripeError(t, err, http.StatusNotFound, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeResourceMissing)
		require.Contains(t, stripeErr.Msg, "pi_missing")
	})

	t.Run("UnrecognizedURL", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		_, err := bundle.api.Charges.Get("ch_1", nil)
		stripeErr := requireStripeError(t, err, http.StatusNotFound, stripe.ErrorTypeInvalidRequest, "")
		require.Contains(t, stripeErr.Msg, "Unrecognized request URL")
	})
}
