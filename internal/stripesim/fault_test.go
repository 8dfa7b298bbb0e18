package stripesim

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
)

func TestFault(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	t.Run("AuthenticationRequired", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindAuthenticationRequired}))
		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard, stripe.ErrorCodeAuthenticationRequired)
		require.Equal(t, stripe.DeclineCodeAuthenticationRequired, stripeErr.DeclineCode)
		require.NotNil(t, stripeErr.PaymentIntent)
		require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, stripeErr.PaymentIntent.Status)
		require.Equal(t, stripe.ErrorCodeAuthenticationRequired, stripeErr.PaymentIntent.LastPaymentError.Code)

		all := bundle.sim.PaymentIntentList()
		require.Len(t, all, 1)
		require.Equal(t, stripeErr.PaymentIntent.ID, all[0].ID)
		requireEventTypes(t, bundle.sim, "payment_intent.payment_failed")
	})

	t.Run("Decline", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindDecline, DeclineCode: "insufficient_funds"}))
		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard, stripe.ErrorCodeCardDeclined)
		require.Equal(t, stripe.DeclineCodeInsufficientFunds, stripeErr.DeclineCode)
		require.Equal(t, "Your card has insufficient funds.", stripeErr.Msg)
		var cardErr *stripe.CardError
		require.ErrorAs(t, err, &cardErr)
		require.Equal(t, stripe.DeclineCodeInsufficientFunds, cardErr.DeclineCode)

		pi := stripeErr.PaymentIntent
		require.NotNil(t, pi)
		require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, pi.Status)
		require.Equal(t, int64(0), pi.AmountReceived)
		require.Equal(t, "charge-key-k1", pi.Metadata["tally_charge_key"])
		require.NotNil(t, pi.LastPaymentError)
		require.Equal(t, stripe.DeclineCodeInsufficientFunds, pi.LastPaymentError.DeclineCode)
		require.Equal(t, pi.LatestCharge.ID, stripeErr.ChargeID)
		require.Equal(t, PaymentMethodDefault, stripeErr.PaymentMethod.ID)

		// The 402 is stored: the same key replays it, creating nothing.
		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		replayErr := requireStripeError(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard, stripe.ErrorCodeCardDeclined)
		require.Equal(t, pi.ID, replayErr.PaymentIntent.ID)
		require.Equal(t, "true", replayErr.LastResponse.Header.Get("Idempotent-Replayed"))

		require.Len(t, bundle.sim.PaymentIntentList(), 1)
		requireEventTypes(t, bundle.sim, "payment_intent.payment_failed")
		require.Equal(t, 1, bundle.sim.Stats().Requests["POST /v1/payment_intents"]["declined"])
	})

	t.Run("DeclineGlobalDefaultCode", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: FaultCustomerAll, Kind: FaultKindDecline, Count: 1}))
		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_b", 700, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard, stripe.ErrorCodeCardDeclined)
		require.Equal(t, stripe.DeclineCodeGenericDecline, stripeErr.DeclineCode)

		// Count 1: the next request is not declined.
		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_b", 700, "k2"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	})

	t.Run("DropAfterCreate", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindDropAfterCreate, Count: 1}))
		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.Error(t, err)
		var stripeErr *stripe.Error
		require.NotErrorAs(t, err, &stripeErr, "a dropped connection is a transport error")

		all := bundle.sim.PaymentIntentList()
		require.Len(t, all, 1, "the PaymentIntent was created before the connection dropped")
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, all[0].Status)

		// A retry with the same key replays the stored success.
		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, all[0].ID, pi.ID)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
		require.Equal(t, "true", pi.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Len(t, bundle.sim.PaymentIntentList(), 1)
		require.Equal(t, 1, bundle.sim.Stats().Requests["POST /v1/payment_intents"]["dropped"])
	})

	t.Run("Error500AfterCreate", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindError500AfterCreate, Count: 1}))
		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		_ = requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		var apiErr *stripe.APIError
		require.ErrorAs(t, err, &apiErr)

		all := bundle.sim.PaymentIntentList()
		require.Len(t, all, 1, "the money moved although the client saw a 500")
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, all[0].Status)
		requireEventTypes(t, bundle.sim, "payment_intent.succeeded")

		// The stored 500 is replayed to the same key even though the fault is used up.
		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		require.Equal(t, "true", stripeErr.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Len(t, bundle.sim.PaymentIntentList(), 1)

		// Reconciliation finds it by listing the customer's PaymentIntents.
		iter := bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{Customer: stripe.String("cus_a")})
		require.True(t, iter.Next())
		require.Equal(t, all[0].ID, iter.PaymentIntent().ID)
		require.Equal(t, "charge-key-k1", iter.PaymentIntent().Metadata["tally_charge_key"])
		require.False(t, iter.Next())
		require.NoError(t, iter.Err())
	})

	t.Run("Error500BeforeCreate", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindError500BeforeCreate, Count: 1}))
		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		_ = requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		require.Empty(t, bundle.sim.PaymentIntentList())

		// Stored: the same key keeps getting the 500 until it expires.
		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		require.Equal(t, "true", stripeErr.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Empty(t, bundle.sim.PaymentIntentList())

		_, err = bundle.sim.ClockAdvance(IdempotencyRetentionDefault)
		require.NoError(t, err)
		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
		require.Len(t, bundle.sim.PaymentIntentList(), 1)
	})

	t.Run("LatencyGlobalAppliesToReads", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: FaultCustomerAll, Kind: FaultKindLatency, Latency: time.Hour, Count: 1}))
		shortCtx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			params := &stripe.CustomerParams{}
			params.Context = shortCtx
			_, err := bundle.api.Customers.Get("cus_a", params)
			errc <- err
		}()
		require.Eventually(t, func() bool { return len(bundle.sim.FaultList()) == 0 }, 10*time.Second, time.Millisecond)
		cancel()
		require.ErrorIs(t, <-errc, context.Canceled)

		_, err := bundle.api.Customers.Get("cus_a", nil)
		require.NoError(t, err)
	})

	t.Run("Precedence", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: FaultCustomerAll, Kind: FaultKindDecline}))
		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindProcessing}))

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusProcessing, pi.Status, "the customer's fault wins over the global one")

		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_b", 700, "k2"))
		_ = requireStripeError(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard, stripe.ErrorCodeCardDeclined)

		// Adding the same customer and kind replaces the fault.
		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: FaultCustomerAll, Kind: FaultKindDecline, DeclineCode: "expired_card"}))
		faults := bundle.sim.FaultList()
		require.Len(t, faults, 2)
		require.Equal(t, "expired_card", faults[0].DeclineCode)

		bundle.sim.FaultClear()
		require.Empty(t, bundle.sim.FaultList())
		pi, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_b", 700, "k3"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	})

	t.Run("Processing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindProcessing, Count: 2}))
		first, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusProcessing, first.Status)
		require.Equal(t, int64(0), first.AmountReceived)
		second, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 800, "k2"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusProcessing, second.Status)

		settled, err := bundle.sim.PaymentIntentSettle(first.ID, PaymentIntentSettleParams{Status: SettleStatusSucceeded})
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, settled.Status)
		got, err := bundle.api.PaymentIntents.Get(first.ID, nil)
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, got.Status)
		require.Equal(t, int64(700), got.AmountReceived)

		failed, err := bundle.sim.PaymentIntentSettle(second.ID, PaymentIntentSettleParams{Status: SettleStatusFailed, DeclineCode: "insufficient_funds"})
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, failed.Status)
		require.Equal(t, stripe.DeclineCodeInsufficientFunds, failed.LastPaymentError.DeclineCode)

		_, err = bundle.sim.PaymentIntentSettle(first.ID, PaymentIntentSettleParams{Status: SettleStatusFailed})
		require.ErrorIs(t, err, ErrConflict)
		_, err = bundle.sim.PaymentIntentSettle("pi_missing", PaymentIntentSettleParams{Status: SettleStatusFailed})
		require.ErrorIs(t, err, ErrNotFound)
		_, err = bundle.sim.PaymentIntentSettle(second.ID, PaymentIntentSettleParams{Status: "done"})
		require.ErrorIs(t, err, ErrInvalid)

		// The stored response is a snapshot: the key still replays "processing", as on Stripe.
		replayed, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusProcessing, replayed.Status)

		requireEventTypes(t, bundle.sim,
			"payment_intent.processing", "payment_intent.processing",
			"payment_intent.succeeded", "payment_intent.payment_failed")
	})

	t.Run("RateLimit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindRateLimit, Count: 2}))
		for range 2 {
			_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
			_ = requireStripeError(t, err, http.StatusTooManyRequests, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeRateLimit)
			require.Empty(t, bundle.sim.PaymentIntentList())
		}

		// 429s are not stored: the same key now executes.
		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
		require.Empty(t, pi.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Len(t, bundle.sim.PaymentIntentList(), 1)
		require.Equal(t, 2, bundle.sim.Stats().Requests["POST /v1/payment_intents"]["rate_limited"])
	})

	t.Run("ListError500", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)

		list := func(customer string) ([]*stripe.PaymentIntent, error) {
			iter := bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{
				ListParams: stripe.ListParams{Context: ctx}, Customer: stripe.String(customer)})
			var pis []*stripe.PaymentIntent
			for iter.Next() {
				pis = append(pis, iter.PaymentIntent())
			}
			return pis, iter.Err()
		}
		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindListError500, Count: 1}))
		// Creations and other customers' listings do not take it.
		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 800, "k2"))
		require.NoError(t, err)
		_, err = list("cus_b")
		require.NoError(t, err)

		_, err = list("cus_a")
		_ = requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		pis, err := list("cus_a")
		require.NoError(t, err, "the fault was for one listing")
		require.Len(t, pis, 2)
	})

	t.Run("RequiresAction", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindRequiresAction}))
		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusRequiresAction, pi.Status)
		require.NotNil(t, pi.NextAction)
		require.Equal(t, stripe.PaymentIntentNextActionType("use_stripe_sdk"), pi.NextAction.Type)
		require.Nil(t, pi.LatestCharge)

		replayed, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, pi.ID, replayed.ID)
		require.Equal(t, stripe.PaymentIntentStatusRequiresAction, replayed.Status)

		canceled, err := bundle.sim.PaymentIntentSettle(pi.ID, PaymentIntentSettleParams{Status: SettleStatusCanceled})
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusCanceled, canceled.Status)
		require.NotZero(t, canceled.CanceledAt)
		requireEventTypes(t, bundle.sim, "payment_intent.requires_action", "payment_intent.canceled")
	})

	t.Run("Validation", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		for _, f := range []Fault{
			{Customer: "", Kind: FaultKindDecline},
			{Customer: "acct_1", Kind: FaultKindDecline},
			{Customer: "cus_a", Kind: "explode"},
			{Customer: "cus_a", Kind: FaultKindDecline, Count: -1},
			{Customer: "cus_a", Kind: FaultKindLatency},
		} {
			require.ErrorIs(t, bundle.sim.FaultAdd(f), ErrInvalid, "%+v", f)
		}
		require.Empty(t, bundle.sim.FaultList())
	})

	t.Run("WireFormat", func(t *testing.T) {
		t.Parallel()

		var f Fault
		require.NoError(t, json.Unmarshal([]byte(`{"customer":"cus_x","kind":"latency","count":3,"latency_ms":1500}`), &f))
		require.Equal(t, Fault{Customer: "cus_x", Kind: FaultKindLatency, Count: 3, Latency: 1500 * time.Millisecond}, f)
		b, err := json.Marshal(f)
		require.NoError(t, err)
		require.JSONEq(t, `{"customer":"cus_x","kind":"latency","count":3,"latency_ms":1500}`, string(b))
		require.Error(t, json.Unmarshal([]byte(`{"customer":"cus_x","kind":"latency","latency":"1s"}`), &f))
	})
}

// requireEventTypes asserts the types of every event generated so far, in order.
func requireEventTypes(t *testing.T, sim *Server, types ...string) {
	t.Helper()
	var got []string
	for _, ev := range sim.EventList() {
		got = append(got, ev.Type)
	}
	require.Equal(t, types, got)
}
