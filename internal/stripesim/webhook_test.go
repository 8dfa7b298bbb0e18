package stripesim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/webhook"
)

const testWebhookSecret = "whsec_test_secret"

// webhookDelivered is one request the test receiver got.
type webhookDelivered struct {
	payload   []byte
	signature string
}

// webhookReceiver is a webhook endpoint that records deliveries; failFirst makes its first
// answers 500.
type webhookReceiver struct {
	server    *httptest.Server
	received  chan webhookDelivered
	failFirst atomic.Int64
}

func newWebhookReceiver(t *testing.T) *webhookReceiver {
	t.Helper()
	rcv := &webhookReceiver{received: make(chan webhookDelivered, 100)}
	rcv.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if rcv.failFirst.Add(-1) >= 0 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		rcv.received <- webhookDelivered{payload: body, signature: r.Header.Get("Stripe-Signature")}
	}))
	t.Cleanup(rcv.server.Close)
	return rcv
}

// next waits for the next delivery and verifies it with stripe-go's webhook package.
func (rcv *webhookReceiver) next(t *testing.T) *stripe.Event {
	t.Helper()
	select {
	case d := <-rcv.received:
		ev, err := webhook.ConstructEventWithOptions(d.payload, d.signature, testWebhookSecret,
			webhook.ConstructEventOptions{IgnoreAPIVersionMismatch: true})
		require.NoError(t, err)
		return &ev
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no webhook delivered")
		return nil
	}
}

func (rcv *webhookReceiver) requireNoMore(t *testing.T) {
	t.Helper()
	select {
	case d := <-rcv.received:
		require.FailNow(t, "unexpected extra delivery", string(d.payload))
	default:
	}
}

func TestWebhook(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	setupWebhook := func(t *testing.T) (*testBundle, *webhookReceiver) {
		t.Helper()
		rcv := newWebhookReceiver(t)
		bundle := setup(t, &testSetupOpts{config: Config{
			WebhookURL:          rcv.server.URL,
			WebhookSecret:       testWebhookSecret,
			WebhookRetryBackoff: time.Millisecond,
		}})
		return bundle, rcv
	}

	t.Run("ChargeRefundAndDispute", func(t *testing.T) {
		t.Parallel()
		bundle, rcv := setupWebhook(t)

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.EventType("payment_intent.succeeded"), rcv.next(t).Type)

		ch, err := bundle.sim.ChargeRefund(pi.LatestCharge.ID, 300)
		require.NoError(t, err)
		require.Equal(t, int64(300), ch.AmountRefunded)
		require.False(t, ch.Refunded)
		ev := rcv.next(t)
		require.Equal(t, stripe.EventType("refund.created"), ev.Type)
		var re stripe.Refund
		require.NoError(t, json.Unmarshal(ev.Data.Raw, &re))
		require.Equal(t, int64(300), re.Amount)
		require.Equal(t, pi.LatestCharge.ID, re.Charge.ID)
		require.Equal(t, pi.ID, re.PaymentIntent.ID)
		require.Equal(t, stripe.RefundStatusSucceeded, re.Status)
		require.Empty(t, ev.Request.ID, "a control-API refund has no API request")
		ev = rcv.next(t)
		require.Equal(t, stripe.EventType("charge.refunded"), ev.Type)
		var refunded stripe.Charge
		require.NoError(t, json.Unmarshal(ev.Data.Raw, &refunded))
		require.Equal(t, pi.LatestCharge.ID, refunded.ID)
		require.Equal(t, int64(300), refunded.AmountRefunded)
		require.Equal(t, pi.ID, refunded.PaymentIntent.ID)
		require.Len(t, refunded.Refunds.Data, 1)
		require.Equal(t, re.ID, refunded.Refunds.Data[0].ID)
		require.Equal(t, int64(300), refunded.Refunds.Data[0].Amount)

		_, err = bundle.sim.ChargeRefund(pi.LatestCharge.ID, 701)
		require.ErrorIs(t, err, ErrInvalid)
		ch, err = bundle.sim.ChargeRefund(pi.LatestCharge.ID, 0) // the rest
		require.NoError(t, err)
		require.True(t, ch.Refunded)
		require.Equal(t, "700", rcv.next(t).GetObjectValue("amount")) // refund.created
		require.Equal(t, "1000", rcv.next(t).GetObjectValue("amount_refunded"))
		_, err = bundle.sim.ChargeRefund(pi.LatestCharge.ID, 0)
		require.ErrorIs(t, err, ErrConflict)

		dp, err := bundle.sim.ChargeDispute(pi.LatestCharge.ID)
		require.NoError(t, err)
		require.Equal(t, pi.LatestCharge.ID, dp.Charge.ID)
		require.Equal(t, int64(1000), dp.Amount)
		ev = rcv.next(t)
		require.Equal(t, stripe.EventType("charge.dispute.created"), ev.Type)
		require.Equal(t, dp.ID, ev.GetObjectValue("id"))
		require.Equal(t, pi.LatestCharge.ID, ev.GetObjectValue("charge"))
		_, err = bundle.sim.ChargeDispute(pi.LatestCharge.ID)
		require.ErrorIs(t, err, ErrConflict)
		_, err = bundle.sim.ChargeDispute("ch_missing")
		require.ErrorIs(t, err, ErrNotFound)
	})

	t.Run("Duplicate", func(t *testing.T) {
		t.Parallel()
		bundle, rcv := setupWebhook(t)

		mode, err := bundle.sim.WebhookModeSet(WebhookMode{Duplicate: 2})
		require.NoError(t, err)
		require.Equal(t, rcv.server.URL, mode.URL, "an empty URL keeps the configured one")

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		first := rcv.next(t)
		for range 2 {
			dup := rcv.next(t)
			require.Equal(t, first.ID, dup.ID)
			require.Equal(t, first.Data.Raw, dup.Data.Raw)
		}
		require.Equal(t, pi.ID, first.GetObjectValue("id"))

		require.Eventually(t, func() bool {
			events := bundle.sim.EventList()
			return len(events) == 1 && events[0].DeliveryAttempts == 3 && events[0].Delivered
		}, 10*time.Second, 5*time.Millisecond)
		rcv.requireNoMore(t)
	})

	t.Run("EventsWithoutURL", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		events := bundle.sim.EventList()
		require.Len(t, events, 1)
		require.Equal(t, pi.ID, events[0].ObjectID)
		require.False(t, events[0].Delivered)
		require.ErrorIs(t, bundle.sim.EventResend(events[0].ID), ErrConflict)
		require.ErrorIs(t, bundle.sim.EventResend("evt_missing"), ErrNotFound)

		// The payload is a valid Stripe event even when not delivered.
		var ev stripe.Event
		require.NoError(t, json.Unmarshal(events[0].Payload, &ev))
		require.Equal(t, "event", ev.Object)
		require.Equal(t, APIVersion, ev.APIVersion)
		require.Equal(t, stripe.APIVersion, ev.APIVersion)
	})

	t.Run("Reorder", func(t *testing.T) {
		t.Parallel()
		bundle, rcv := setupWebhook(t)

		// A long flush wait: the three deliveries are shuffled together however slow the
		// machine is.
		_, err := bundle.sim.WebhookModeSet(WebhookMode{Reorder: true, ReorderWindow: 3, ReorderFlush: time.Hour})
		require.NoError(t, err)
		var created []string
		for _, key := range []string{"k1", "k2", "k3"} {
			pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, key))
			require.NoError(t, err)
			created = append(created, pi.ID)
		}
		var delivered []string
		for range 3 {
			delivered = append(delivered, rcv.next(t).GetObjectValue("id"))
		}
		require.ElementsMatch(t, created, delivered)
		require.NotEqual(t, created, delivered)
	})

	t.Run("Resend", func(t *testing.T) {
		t.Parallel()
		bundle, rcv := setupWebhook(t)

		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		first := rcv.next(t)
		require.NoError(t, bundle.sim.EventResend(first.ID))
		again := rcv.next(t)
		require.Equal(t, first.ID, again.ID)
	})

	t.Run("Retry", func(t *testing.T) {
		t.Parallel()
		bundle, rcv := setupWebhook(t)
		rcv.failFirst.Store(2)

		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		ev := rcv.next(t)
		require.Equal(t, stripe.EventType("payment_intent.succeeded"), ev.Type)
		require.Eventually(t, func() bool {
			events := bundle.sim.EventList()
			return events[0].Delivered && events[0].DeliveryAttempts == 3
		}, 10*time.Second, 5*time.Millisecond)
		stats := bundle.sim.Stats()
		require.Equal(t, 3, stats.WebhookAttempts)
		require.Equal(t, 1, stats.WebhookDelivered)
	})

	t.Run("RetryGivesUp", func(t *testing.T) {
		t.Parallel()
		bundle, rcv := setupWebhook(t)
		rcv.failFirst.Store(1000)

		_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return bundle.sim.Stats().WebhookFailed == 1 }, 10*time.Second, 5*time.Millisecond)
		events := bundle.sim.EventList()
		require.False(t, events[0].Delivered)
		require.Equal(t, WebhookMaxAttemptsDefault, events[0].DeliveryAttempts)
		require.Contains(t, events[0].LastDeliveryError, "500")
	})

	t.Run("SettleEvents", func(t *testing.T) {
		t.Parallel()
		bundle, rcv := setupWebhook(t)

		require.NoError(t, bundle.sim.FaultAdd(Fault{Customer: "cus_a", Kind: FaultKindProcessing}))
		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.EventType("payment_intent.processing"), rcv.next(t).Type)

		_, err = bundle.sim.ClockAdvance(48 * time.Hour)
		require.NoError(t, err)
		_, err = bundle.sim.PaymentIntentSettle(pi.ID, PaymentIntentSettleParams{Status: SettleStatusSucceeded})
		require.NoError(t, err)
		// Signed with the wall clock: it verifies with tolerance even after the clock jump.
		ev := rcv.next(t)
		require.Equal(t, stripe.EventType("payment_intent.succeeded"), ev.Type)
		require.Equal(t, pi.Created+48*3600, ev.Created)
		require.Empty(t, ev.Request.ID, "automatic events have request.id null")
	})

	t.Run("Signature", func(t *testing.T) {
		t.Parallel()
		bundle, rcv := setupWebhook(t)

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)

		var d webhookDelivered
		select {
		case d = <-rcv.received:
		case <-time.After(10 * time.Second):
			require.FailNow(t, "no webhook delivered")
		}
		// stripe-go verifies the signature (with its default 300 s tolerance).
		ev, err := webhook.ConstructEventWithOptions(d.payload, d.signature, testWebhookSecret,
			webhook.ConstructEventOptions{IgnoreAPIVersionMismatch: true})
		require.NoError(t, err)
		_, err = webhook.ConstructEventWithOptions(d.payload, d.signature, "whsec_other",
			webhook.ConstructEventOptions{IgnoreAPIVersionMismatch: true})
		require.ErrorIs(t, err, webhook.ErrNoValidSignature)
		_, err = webhook.ConstructEvent(d.payload, d.signature, testWebhookSecret)
		require.NoError(t, err, "the event's api_version is stripe-go v76's")

		require.Equal(t, stripe.EventType("payment_intent.succeeded"), ev.Type)
		require.Equal(t, "event", ev.Object)
		require.False(t, ev.Livemode)
		require.Equal(t, int64(1), ev.PendingWebhooks)
		require.Equal(t, pi.LastResponse.RequestID, ev.Request.ID)
		require.Equal(t, "k1", ev.Request.IdempotencyKey)
		var got stripe.PaymentIntent
		require.NoError(t, json.Unmarshal(ev.Data.Raw, &got))
		require.Equal(t, pi.ID, got.ID)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, got.Status)
		require.Equal(t, "charge-key-k1", got.Metadata["tally_charge_key"])
	})

	t.Run("WebhookModeValidation", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		for _, mode := range []WebhookMode{
			{Duplicate: -1},
			{Duplicate: WebhookDuplicateMax + 1},
			{Delay: -time.Second},
			{ReorderWindow: 101},
			{ReorderFlush: -time.Second},
		} {
			_, err := bundle.sim.WebhookModeSet(mode)
			require.ErrorIs(t, err, ErrInvalid, "%+v", mode)
		}
	})
}

func TestServerClose(t *testing.T) {
	t.Parallel()

	sim := New(Config{WebhookURL: "http://127.0.0.1:1/unreachable"})
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sim.Close()
		}()
	}
	wg.Wait()
	sim.Close()
}
