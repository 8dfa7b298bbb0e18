package stripesim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
)

// refundParams are the parameters a refund job would send: the PaymentIntent, an amount (0
// leaves it out: everything not yet refunded) and an idempotency key ("" for none).
func refundParams(ctx context.Context, paymentIntentID string, amount int64, key string) *stripe.RefundParams {
	params := &stripe.RefundParams{
		PaymentIntent: stripe.String(paymentIntentID),
		Reason:        stripe.String(string(stripe.RefundReasonRequestedByCustomer)),
	}
	params.Context = ctx
	if amount != 0 {
		params.Amount = stripe.Int64(amount)
	}
	params.AddMetadata("tally_refund_key", "refund-key-"+key)
	if key != "" {
		params.SetIdempotencyKey(key)
	}
	return params
}

// createSucceeded creates a succeeded PaymentIntent for the customer through stripe-go.
func createSucceeded(ctx context.Context, t *testing.T, bundle *testBundle, customerID string, amount int64, key string) *stripe.PaymentIntent {
	t.Helper()
	pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, customerID, amount, key))
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	return pi
}

// lastChargeRefunded decodes data.object of the latest charge.refunded event.
func lastChargeRefunded(t *testing.T, sim *Server) *stripe.Charge {
	t.Helper()
	events := sim.EventList()
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].Type != eventTypeChargeRefunded {
			continue
		}
		var ev stripe.Event
		require.NoError(t, json.Unmarshal(events[i].Payload, &ev))
		var ch stripe.Charge
		require.NoError(t, json.Unmarshal(ev.Data.Raw, &ch))
		return &ch
	}
	require.FailNow(t, "no charge.refunded event")
	return nil
}

// refundIDs returns the ids of refunds, in order.
func refundIDs(refunds []*stripe.Refund) []string {
	ids := make([]string, len(refunds))
	for i, re := range refunds {
		ids[i] = re.ID
	}
	return ids
}

func TestRefund(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	t.Run("ConcurrentSameKey", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		// The first refund takes the key, then sits in a long injected latency.
		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindLatency, Latency: time.Hour, Count: 1}))
		firstCtx, cancelFirst := context.WithCancel(ctx)
		defer cancelFirst()
		firstErr := make(chan error, 1)
		go func() {
			_, err := bundle.api.Refunds.New(refundParams(firstCtx, pi.ID, 0, "r1"))
			firstErr <- err
		}()
		require.Eventually(t, func() bool { return len(bundle.sim.FaultList()) == 0 }, 10*time.Second, time.Millisecond)

		_, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r1"))
		_ = requireStripeError(t, err, http.StatusConflict, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeIdempotencyKeyInUse)
		require.Empty(t, bundle.sim.RefundList())

		// The first client gives up; the refund is still made and stored under the key.
		cancelFirst()
		require.ErrorIs(t, <-firstErr, context.Canceled)
		var (
			replayed *stripe.Refund
			retryErr error
		)
		require.Eventually(t, func() bool {
			replayed, retryErr = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r1"))
			var stripeErr *stripe.Error
			return !errors.As(retryErr, &stripeErr) || stripeErr.Code != stripe.ErrorCodeIdempotencyKeyInUse
		}, 10*time.Second, 5*time.Millisecond)
		require.NoError(t, retryErr)
		require.Equal(t, "true", replayed.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Equal(t, []string{replayed.ID}, refundIDs(bundle.sim.RefundList()))
		// The second request, and any retry above that came while the first was still executing.
		require.GreaterOrEqual(t, bundle.sim.Stats().Requests["POST /v1/refunds"]["idempotency_key_in_use"], 1)
	})

	t.Run("Create", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, &testSetupOpts{config: Config{Now: func() time.Time { return testBaseTime }}})
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		re, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r1"))
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(re.ID, "re_"), re.ID)
		require.Equal(t, "refund", re.Object)
		require.Equal(t, int64(1000), re.Amount, "no amount: everything")
		require.Equal(t, stripe.RefundStatusSucceeded, re.Status)
		require.Equal(t, stripe.Currency("usd"), re.Currency)
		require.Equal(t, pi.LatestCharge.ID, re.Charge.ID)
		require.Equal(t, pi.ID, re.PaymentIntent.ID)
		require.Equal(t, stripe.RefundReasonRequestedByCustomer, re.Reason)
		require.Equal(t, "refund-key-r1", re.Metadata["tally_refund_key"])
		require.Equal(t, testBaseTime.Unix(), re.Created)
		require.True(t, strings.HasPrefix(re.LastResponse.RequestID, "req_"))
		require.Equal(t, "r1", re.LastResponse.IdempotencyKey)

		ch := lastChargeRefunded(t, bundle.sim)
		require.Equal(t, int64(1000), ch.AmountRefunded)
		require.True(t, ch.Refunded)

		all := bundle.sim.RefundList()
		require.Equal(t, []string{re.ID}, refundIDs(all))
		require.Equal(t, int64(1000), all[0].Amount)
		stats := bundle.sim.Stats()
		require.Equal(t, 1, stats.RefundsCreated)
		require.Equal(t, 1, stats.Requests["POST /v1/refunds"]["succeeded"])
	})

	t.Run("DifferentParams", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		_, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 300, "r1"))
		require.NoError(t, err)

		_, err = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 400, "r1"))
		stripeErr := requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeIdempotency, "")
		require.Contains(t, stripeErr.Msg, "Keys for idempotent requests can only be used with the same parameters they were first used with")
		var idemErr *stripe.IdempotencyError
		require.ErrorAs(t, err, &idemErr)

		// The same key on another endpoint is a mismatch too.
		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 300, "r1"))
		_ = requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeIdempotency, "")

		require.Len(t, bundle.sim.RefundList(), 1)
		require.Len(t, bundle.sim.PaymentIntentList(), 1)
		require.Equal(t, 1, bundle.sim.Stats().Requests["POST /v1/refunds"]["idempotency_error"])
	})

	t.Run("Events", func(t *testing.T) {
		t.Parallel()
		rcv := newWebhookReceiver(t)
		bundle := setup(t, &testSetupOpts{config: Config{WebhookURL: rcv.server.URL, WebhookSecret: testWebhookSecret}})
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")
		require.Equal(t, stripe.EventType("payment_intent.succeeded"), rcv.next(t).Type)

		re, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 250, "r1"))
		require.NoError(t, err)

		// Signed deliveries that stripe-go verifies: refund.created, then charge.refunded.
		ev := rcv.next(t)
		require.Equal(t, stripe.EventType("refund.created"), ev.Type)
		require.Equal(t, re.LastResponse.RequestID, ev.Request.ID)
		require.Equal(t, "r1", ev.Request.IdempotencyKey)
		var created stripe.Refund
		require.NoError(t, json.Unmarshal(ev.Data.Raw, &created))
		require.Equal(t, re.ID, created.ID)
		require.Equal(t, int64(250), created.Amount)
		require.Equal(t, pi.LatestCharge.ID, created.Charge.ID)
		require.Equal(t, pi.ID, created.PaymentIntent.ID)
		require.Equal(t, stripe.RefundStatusSucceeded, created.Status)

		ev = rcv.next(t)
		require.Equal(t, stripe.EventType("charge.refunded"), ev.Type)
		require.Equal(t, re.LastResponse.RequestID, ev.Request.ID)
		var ch stripe.Charge
		require.NoError(t, json.Unmarshal(ev.Data.Raw, &ch))
		require.Equal(t, pi.LatestCharge.ID, ch.ID)
		require.Equal(t, int64(250), ch.AmountRefunded)
		require.False(t, ch.Refunded)
		require.Equal(t, []string{re.ID}, refundIDs(ch.Refunds.Data))

		// A replay emits nothing.
		_, err = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 250, "r1"))
		require.NoError(t, err)
		requireEventTypes(t, bundle.sim, "payment_intent.succeeded", "refund.created", "charge.refunded")
		rcv.requireNoMore(t)
	})

	t.Run("FaultDropAfterCreate", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindDropAfterCreate, Count: 1}))
		_, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r1"))
		require.Error(t, err)
		var stripeErr *stripe.Error
		require.NotErrorAs(t, err, &stripeErr, "a dropped connection is a transport error")
		all := bundle.sim.RefundList()
		require.Len(t, all, 1, "the refund was made before the connection dropped")

		// A retry with the same key gets the stored success.
		re, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r1"))
		require.NoError(t, err)
		require.Equal(t, all[0].ID, re.ID)
		require.Equal(t, "true", re.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Len(t, bundle.sim.RefundList(), 1)
		require.Equal(t, 1, bundle.sim.Stats().Requests["POST /v1/refunds"]["dropped"])
	})

	t.Run("FaultError500AfterCreate", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		// The fault is the refund's customer's (the PaymentIntent's); another customer's
		// refund is not affected.
		other := createSucceeded(ctx, t, bundle, "cus_b", 500, "pi-k2")
		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindError500AfterCreate, Count: 1}))
		_, err := bundle.api.Refunds.New(refundParams(ctx, other.ID, 0, "r-other"))
		require.NoError(t, err)

		_, err = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 400, "r1"))
		_ = requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		var apiErr *stripe.APIError
		require.ErrorAs(t, err, &apiErr)
		require.Empty(t, bundle.sim.FaultList())

		// The money moved although the client saw a 500; the 500 is replayed to the key.
		_, err = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 400, "r1"))
		stripeErr := requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		require.Equal(t, "true", stripeErr.LastResponse.Header.Get("Idempotent-Replayed"))

		// Reconciliation finds the refund by listing the PaymentIntent's refunds.
		iter := bundle.api.Refunds.List(&stripe.RefundListParams{PaymentIntent: stripe.String(pi.ID)})
		require.True(t, iter.Next())
		require.Equal(t, int64(400), iter.Refund().Amount)
		require.Equal(t, "refund-key-r1", iter.Refund().Metadata["tally_refund_key"])
		require.False(t, iter.Next())
		require.NoError(t, iter.Err())
		require.Len(t, bundle.sim.RefundList(), 2)
		require.Equal(t, int64(400), lastChargeRefunded(t, bundle.sim).AmountRefunded)
		require.Equal(t, 1, bundle.sim.Stats().Requests["POST /v1/refunds"]["error_500_after_create"])
	})

	t.Run("FaultError500BeforeCreate", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: FaultCustomerAll, Kind: FaultKindError500BeforeCreate, Count: 1}))
		for range 2 { // stored: the same key keeps getting the 500
			_, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r1"))
			_ = requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		}
		require.Empty(t, bundle.sim.RefundList())

		re, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r2"))
		require.NoError(t, err)
		require.Equal(t, int64(1000), re.Amount)
	})

	t.Run("FaultKindsOfPaymentIntentsOnly", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		// Declines shape PaymentIntents, not refunds; a refund refused by Stripe's rules
		// consumes no fault.
		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindDecline}))
		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindError500AfterCreate, Count: 1}))
		_, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 1001, "r1"))
		_ = requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeAmountTooLarge)
		require.Len(t, bundle.sim.FaultList(), 2)

		_, err = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r2"))
		_ = requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		require.Equal(t, []Fault{{Customer: "cus_a", Kind: FaultKindDecline, DeclineCode: DeclineCodeDefault}}, bundle.sim.FaultList())
		require.Len(t, bundle.sim.RefundList(), 1)
	})

	t.Run("FaultRateLimit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindRateLimit, Count: 1}))
		_, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r1"))
		_ = requireStripeError(t, err, http.StatusTooManyRequests, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeRateLimit)
		require.Empty(t, bundle.sim.RefundList())

		// 429s are not stored: the same key now executes.
		re, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r1"))
		require.NoError(t, err)
		require.Empty(t, re.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Len(t, bundle.sim.RefundList(), 1)
		require.Equal(t, 1, bundle.sim.Stats().Requests["POST /v1/refunds"]["rate_limited"])
	})

	t.Run("List", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, &testSetupOpts{config: Config{Now: func() time.Time { return testBaseTime }}})
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")
		other := createSucceeded(ctx, t, bundle, "cus_b", 1000, "pi-k2")

		var ids []string // pi's refunds, oldest first, all in the same second
		for i, key := range []string{"r1", "r2", "r3", "r4", "r5"} {
			re, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, int64(100+i), key))
			require.NoError(t, err)
			ids = append(ids, re.ID)
			_, err = bundle.api.Refunds.New(refundParams(ctx, other.ID, 10, "other-"+key))
			require.NoError(t, err)
		}
		// A refund made in the Dashboard (control API) is listed too.
		_, err := bundle.sim.ChargeRefund(pi.LatestCharge.ID, 1)
		require.NoError(t, err)
		ids = append(ids, bundle.sim.RefundList()[10].ID)
		newestFirst := []string{ids[5], ids[4], ids[3], ids[2], ids[1], ids[0]}

		collect := func(params *stripe.RefundListParams) []string {
			t.Helper()
			var got []string
			iter := bundle.api.Refunds.List(params)
			for iter.Next() {
				got = append(got, iter.Refund().ID)
			}
			require.NoError(t, iter.Err())
			return got
		}

		// Newest first, paged two at a time by the iterator (starting_after).
		got := collect(&stripe.RefundListParams{
			PaymentIntent: stripe.String(pi.ID),
			ListParams:    stripe.ListParams{Limit: stripe.Int64(2)},
		})
		require.Equal(t, newestFirst, got)
		require.Equal(t, 3, bundle.sim.Stats().Requests["GET /v1/refunds"]["ok"])

		got = collect(&stripe.RefundListParams{
			PaymentIntent: stripe.String(pi.ID),
			ListParams:    stripe.ListParams{StartingAfter: stripe.String(ids[3]), Single: true},
		})
		require.Equal(t, []string{ids[2], ids[1], ids[0]}, got)

		got = collect(&stripe.RefundListParams{Charge: stripe.String(pi.LatestCharge.ID)})
		require.Equal(t, newestFirst, got)
		require.Len(t, collect(&stripe.RefundListParams{}), 11)

		iter := bundle.api.Refunds.List(&stripe.RefundListParams{ListParams: stripe.ListParams{Single: true}})
		require.True(t, iter.Next())
		require.True(t, iter.Meta().HasMore, "the default page size is 10")
		require.Equal(t, "/v1/refunds", iter.Meta().URL)

		iter = bundle.api.Refunds.List(&stripe.RefundListParams{PaymentIntent: stripe.String("pi_missing")})
		require.False(t, iter.Next())
		stripeErr := requireStripeError(t, iter.Err(), http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeResourceMissing)
		require.Equal(t, "payment_intent", stripeErr.Param)

		iter = bundle.api.Refunds.List(&stripe.RefundListParams{ListParams: stripe.ListParams{StartingAfter: stripe.String("re_missing")}})
		require.False(t, iter.Next())
		_ = requireStripeError(t, iter.Err(), http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeResourceMissing)
	})

	t.Run("NotRefundable", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindProcessing, Count: 1}))
		processing, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "pi-k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusProcessing, processing.Status)
		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindDecline, Count: 1}))
		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "pi-k2"))
		declined := requireStripeError(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard, stripe.ErrorCodeCardDeclined).PaymentIntent
		unconfirmed, err := bundle.api.PaymentIntents.New(&stripe.PaymentIntentParams{
			Amount: stripe.Int64(1000), Currency: stripe.String("usd"), Customer: stripe.String("cus_a"),
		})
		require.NoError(t, err)

		for i, pi := range []*stripe.PaymentIntent{processing, declined, unconfirmed} {
			_, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r"+string(rune('1'+i))))
			stripeErr := requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeChargeNotRefundable)
			require.Equal(t, "This PaymentIntent ("+pi.ID+") does not have a successful charge to refund.", stripeErr.Msg)
			require.Equal(t, "payment_intent", stripeErr.Param)
			var invalid *stripe.InvalidRequestError
			require.ErrorAs(t, err, &invalid)
		}
		require.Empty(t, bundle.sim.RefundList())
		require.Equal(t, 3, bundle.sim.Stats().Requests["POST /v1/refunds"]["charge_not_refundable"])

		// The refusal happened while executing, so it is stored: once the payment settles,
		// the same key still gets it and a new key refunds.
		_, err = bundle.sim.PaymentIntentSettle(processing.ID, PaymentIntentSettleParams{Status: SettleStatusSucceeded})
		require.NoError(t, err)
		_, err = bundle.api.Refunds.New(refundParams(ctx, processing.ID, 0, "r1"))
		stripeErr := requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeChargeNotRefundable)
		require.Equal(t, "true", stripeErr.LastResponse.Header.Get("Idempotent-Replayed"))
		re, err := bundle.api.Refunds.New(refundParams(ctx, processing.ID, 0, "r1-again"))
		require.NoError(t, err)
		require.Equal(t, int64(1000), re.Amount)
	})

	t.Run("OverRefund", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		_, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 1001, "r1"))
		stripeErr := requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeAmountTooLarge)
		require.Equal(t, "Refund amount ($10.01) is greater than charge amount ($10.00)", stripeErr.Msg)
		require.Equal(t, "amount", stripeErr.Param)

		_, err = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 300, "r2"))
		require.NoError(t, err)
		_, err = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 701, "r3"))
		stripeErr = requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeAmountTooLarge)
		require.Equal(t, "Refund amount ($7.01) is greater than unrefunded amount on charge ($7.00)", stripeErr.Msg)

		_, err = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r4"))
		require.NoError(t, err)
		_, err = bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r5"))
		stripeErr = requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeChargeAlreadyRefunded)
		require.Equal(t, "Charge "+pi.LatestCharge.ID+" has already been refunded.", stripeErr.Msg)

		require.Len(t, bundle.sim.RefundList(), 2)
		require.Equal(t, int64(1000), lastChargeRefunded(t, bundle.sim).AmountRefunded)
		requests := bundle.sim.Stats().Requests["POST /v1/refunds"]
		require.Equal(t, map[string]int{"amount_too_large": 2, "succeeded": 2, "charge_already_refunded": 1}, requests)
	})

	t.Run("PartialThenRest", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		partial, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 300, "r1"))
		require.NoError(t, err)
		require.Equal(t, int64(300), partial.Amount)
		ch := lastChargeRefunded(t, bundle.sim)
		require.Equal(t, int64(300), ch.AmountRefunded)
		require.False(t, ch.Refunded)

		rest, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r2"))
		require.NoError(t, err)
		require.Equal(t, int64(700), rest.Amount)
		ch = lastChargeRefunded(t, bundle.sim)
		require.Equal(t, int64(1000), ch.AmountRefunded)
		require.True(t, ch.Refunded)
		require.Equal(t, []string{rest.ID, partial.ID}, refundIDs(ch.Refunds.Data), "the charge lists its refunds newest first")

		// A refund made through the control API shares the same remaining amount.
		_, err = bundle.sim.ChargeRefund(pi.LatestCharge.ID, 0)
		require.ErrorIs(t, err, ErrConflict)
		require.Equal(t, 2, bundle.sim.Stats().RefundsCreated)

		got, err := bundle.api.PaymentIntents.Get(pi.ID, nil)
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, got.Status, "a refunded PaymentIntent stays succeeded")
	})

	t.Run("Replay", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		first, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 300, "r1"))
		require.NoError(t, err)
		second, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 300, "r1"))
		require.NoError(t, err)
		require.Equal(t, first.ID, second.ID)
		require.Equal(t, first.Amount, second.Amount)
		require.Equal(t, "true", second.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Equal(t, first.LastResponse.RequestID, second.LastResponse.Header.Get("Original-Request"))

		require.Len(t, bundle.sim.RefundList(), 1)
		require.Equal(t, int64(300), lastChargeRefunded(t, bundle.sim).AmountRefunded, "refunded once")
		stats := bundle.sim.Stats()
		require.Equal(t, 1, stats.RefundsCreated)
		require.Equal(t, 1, stats.IdempotentReplays)
		require.Equal(t, map[string]int{"succeeded": 1, "replayed": 1}, stats.Requests["POST /v1/refunds"])

		// Past the retention window the key is new again and refunds again.
		_, err = bundle.sim.ClockAdvance(IdempotencyRetentionDefault)
		require.NoError(t, err)
		third, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 300, "r1"))
		require.NoError(t, err)
		require.NotEqual(t, first.ID, third.ID)
		require.Len(t, bundle.sim.RefundList(), 2)
	})

	t.Run("Retrieve", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		created, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "r1"))
		require.NoError(t, err)
		got, err := bundle.api.Refunds.Get(created.ID, nil)
		require.NoError(t, err)
		require.Equal(t, created.ID, got.ID)
		require.Equal(t, created.Amount, got.Amount)
		require.Equal(t, pi.ID, got.PaymentIntent.ID)

		_, err = bundle.api.Refunds.Get("re_missing", nil)
		stripeErr := requireStripeError(t, err, http.StatusNotFound, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeResourceMissing)
		require.Contains(t, stripeErr.Msg, "re_missing")
	})

	t.Run("Validation", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "pi-k1")

		for _, tt := range []struct {
			name   string
			mutate func(*stripe.RefundParams)
			code   stripe.ErrorCode
			param  string
		}{
			{"AmountNegative", func(p *stripe.RefundParams) { p.Amount = stripe.Int64(-1) }, "parameter_invalid_integer", "amount"},
			{"AmountZero", func(p *stripe.RefundParams) { p.Amount = stripe.Int64(0) }, "parameter_invalid_integer", "amount"},
			{"PaymentIntentMissing", func(p *stripe.RefundParams) { p.PaymentIntent = nil }, "parameter_missing", "payment_intent"},
			{"PaymentIntentUnknown", func(p *stripe.RefundParams) { p.PaymentIntent = stripe.String("pi_missing") }, "resource_missing", "payment_intent"},
			{"ReasonUnknown", func(p *stripe.RefundParams) { p.Reason = stripe.String("changed_mind") }, "", "reason"},
		} {
			params := refundParams(ctx, pi.ID, 0, "key-"+tt.name)
			tt.mutate(params)
			_, err := bundle.api.Refunds.New(params)
			stripeErr := requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, tt.code)
			require.Equal(t, tt.param, stripeErr.Param, tt.name)
		}
		require.Empty(t, bundle.sim.RefundList())
		require.Equal(t, 5, bundle.sim.Stats().Requests["POST /v1/refunds"]["invalid_request"])

		// Validation errors are not stored: the same key with valid parameters refunds.
		re, err := bundle.api.Refunds.New(refundParams(ctx, pi.ID, 0, "key-AmountZero"))
		require.NoError(t, err)
		require.Empty(t, re.LastResponse.Header.Get("Idempotent-Replayed"))
		require.Len(t, bundle.sim.RefundList(), 1)
	})
}
