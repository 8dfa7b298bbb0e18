package stripesim

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
)

func TestIdempotency(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	t.Run("ConcurrentSameKey", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		// The first request takes the key, then sits in a long injected latency; the test
		// waits for the fault to be consumed instead of for time to pass.
		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindLatency, Latency: time.Hour, Count: 1}))
		firstCtx, cancelFirst := context.WithCancel(ctx)
		defer cancelFirst()
		firstErr := make(chan error, 1)
		go func() {
			_, err := bundle.api.PaymentIntents.New(chargeParams(firstCtx, "cus_a", 700, "k1"))
			firstErr <- err
		}()
		require.Eventually(t, func() bool { return len(bundle.sim.FaultList()) == 0 }, 10*time.Second, time.Millisecond)

		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusConflict, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeIdempotencyKeyInUse)
		require.Contains(t, stripeErr.Msg, "k1")
		require.Empty(t, bundle.sim.PaymentIntentList(), "the 409 created nothing")
		require.Equal(t, 1, bundle.sim.Stats().Requests["POST /v1/payment_intents"]["idempotency_key_in_use"])

		// The first client gives up; the simulator still executes its request (as Stripe
		// would) and stores the result, which a retry with the key then gets.
		cancelFirst()
		require.ErrorIs(t, <-firstErr, context.Canceled)
		var (
			replayed *stripe.PaymentIntent
			retryErr error
		)
		require.Eventually(t, func() bool {
			replayed, retryErr = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
			var stripeErr *stripe.Error
			return !errors.As(retryErr, &stripeErr) || stripeErr.Code != stripe.ErrorCodeIdempotencyKeyInUse // 409: still executing
		}, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, retryErr)
		require.Equal(t, "true", replayed.LastResponse.Header.Get("Idempotent-Replayed"))

		all := bundle.sim.PaymentIntentList()
		require.Len(t, all, 1)
		require.Equal(t, all[0].ID, replayed.ID)
	})

	t.Run("DifferentParams", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)

		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 701, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeIdempotency, "")
		require.Contains(t, stripeErr.Msg, "Keys for idempotent requests can only be used with the same parameters they were first used with")
		var idemErr *stripe.IdempotencyError
		require.ErrorAs(t, err, &idemErr)

		// Metadata is a parameter too.
		params := chargeParams(ctx, "cus_a", 700, "k1")
		params.AddMetadata("extra", "x")
		_, err = bundle.api.PaymentIntents.New(params)
		_ = requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeIdempotency, "")

		require.Len(t, bundle.sim.PaymentIntentList(), 1)
		require.Equal(t, 2, bundle.sim.Stats().Requests["POST /v1/payment_intents"]["idempotency_error"])
	})

	t.Run("NoKey", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		// stripe-go adds a random key to every POST without one; without any key each request
		// executes.
		first, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, ""))
		require.NoError(t, err)
		second, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, ""))
		require.NoError(t, err)
		require.NotEqual(t, first.ID, second.ID)
		require.Len(t, bundle.sim.PaymentIntentList(), 2)
	})

	t.Run("Replay", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		first, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)

		second, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, first.ID, second.ID)
		require.Equal(t, first.LatestCharge.ID, second.LatestCharge.ID)
		require.Equal(t, first.Created, second.Created)
		require.Equal(t, "true", second.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Equal(t, first.LastResponse.RequestID, second.LastResponse.Header.Get("Original-Request"))
		require.NotEqual(t, first.LastResponse.RequestID, second.LastResponse.RequestID)

		require.Len(t, bundle.sim.PaymentIntentList(), 1)
		require.Len(t, bundle.sim.EventList(), 1, "a replay emits no event")
		stats := bundle.sim.Stats()
		require.Equal(t, 1, stats.IdempotentReplays)
		require.Equal(t, 1, stats.PaymentIntentsCreated)
		require.Equal(t, 1, stats.Requests["POST /v1/payment_intents"]["replayed"])
	})

	t.Run("RetentionConfigured", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, &testSetupOpts{config: Config{IdempotencyRetention: time.Hour}})

		first, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		_, err = bundle.sim.ClockAdvance(time.Hour)
		require.NoError(t, err)
		second, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.NotEqual(t, first.ID, second.ID)
	})
	t.Run("RetentionExpiry", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, &testSetupOpts{config: Config{Now: func() time.Time { return testBaseTime }}})

		first, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)

		// Just inside the window: replay.
		_, err = bundle.sim.ClockAdvance(IdempotencyRetentionDefault - time.Second)
		require.NoError(t, err)
		replayed, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, first.ID, replayed.ID)

		// Past the window (measured from the first use, not the replay): the key is new again.
		_, err = bundle.sim.ClockAdvance(time.Second)
		require.NoError(t, err)
		second, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.NotEqual(t, first.ID, second.ID, "an expired key charges again")
		require.Empty(t, second.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Equal(t, testBaseTime.Add(IdempotencyRetentionDefault).Unix(), second.Created)
		require.Len(t, bundle.sim.PaymentIntentList(), 2)

		// And it may now be used with other parameters.
		_, err = bundle.sim.ClockAdvance(IdempotencyRetentionDefault)
		require.NoError(t, err)
		third, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 999, "k1"))
		require.NoError(t, err)
		require.Equal(t, int64(999), third.Amount)
	})

}

func TestServerIdempotencyExpire(t *testing.T) {
	t.Parallel()
	sim := New(Config{})
	t.Cleanup(sim.Close)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	ctl := &ControlClient{BaseURL: srv.URL}

	post := func(key string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/payment_intents",
			strings.NewReader("amount=100&currency=usd&customer=cus_a&confirm=true&payment_method=pm_card_visa"))
		req.Header.Set("Authorization", "Bearer sk_test_x")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return len(sim.PaymentIntentList())
	}
	require.Equal(t, 1, post("old"))
	_, err := sim.ClockAdvance(time.Hour)
	require.NoError(t, err)
	require.Equal(t, 2, post("young"))

	n, err := ctl.IdempotencyExpire(ctx, 30*time.Minute)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 2, post("young"), "a young key is still replayed")
	require.Equal(t, 3, post("old"), "an expired key acts as new")
}
