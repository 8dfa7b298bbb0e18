package stripesim

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
)

func TestControlClient(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	setupControl := func(t *testing.T, cfg Config) (*testBundle, *ControlClient) {
		t.Helper()
		bundle := setup(t, &testSetupOpts{config: cfg})
		return bundle, &ControlClient{BaseURL: bundle.server.URL + "/"}
	}

	t.Run("ChargeRefundAndDispute", func(t *testing.T) {
		t.Parallel()
		bundle, control := setupControl(t, Config{})

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)

		ch, err := control.ChargeRefund(ctx, pi.LatestCharge.ID, 250)
		require.NoError(t, err)
		require.Equal(t, int64(250), ch.AmountRefunded)
		_, err = control.ChargeRefund(ctx, "ch_missing", 0)
		require.ErrorIs(t, err, ErrNotFound)

		dp, err := control.ChargeDispute(ctx, pi.LatestCharge.ID)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(dp.ID, "dp_"))
		require.Equal(t, stripe.DisputeStatusNeedsResponse, dp.Status)
		_, err = control.ChargeDispute(ctx, pi.LatestCharge.ID)
		require.ErrorIs(t, err, ErrConflict)
	})

	t.Run("Clock", func(t *testing.T) {
		t.Parallel()
		_, control := setupControl(t, Config{Now: func() time.Time { return testBaseTime }})

		now, err := control.ClockNow(ctx)
		require.NoError(t, err)
		require.True(t, testBaseTime.Equal(now))

		now, err = control.ClockAdvance(ctx, 25*time.Hour)
		require.NoError(t, err)
		require.True(t, testBaseTime.Add(25*time.Hour).Equal(now))

		_, err = control.ClockAdvance(ctx, -time.Second)
		require.ErrorIs(t, err, ErrInvalid)
	})

	t.Run("Customer", func(t *testing.T) {
		t.Parallel()
		bundle, control := setupControl(t, Config{})

		c, err := control.CustomerSetDefaultPaymentMethod(ctx, "cus_a", "")
		require.NoError(t, err)
		require.Nil(t, c.InvoiceSettings.DefaultPaymentMethod)
		got, err := bundle.api.Customers.Get("cus_a", nil)
		require.NoError(t, err)
		require.Nil(t, got.InvoiceSettings.DefaultPaymentMethod)

		c, err = control.CustomerSetDefaultPaymentMethod(ctx, "cus_a", "pm_card_amex")
		require.NoError(t, err)
		require.Equal(t, "pm_card_amex", c.InvoiceSettings.DefaultPaymentMethod.ID)

		_, err = control.CustomerSetDefaultPaymentMethod(ctx, "nope", "pm_card_amex")
		require.ErrorIs(t, err, ErrNotFound)
	})

	t.Run("Events", func(t *testing.T) {
		t.Parallel()
		bundle, control := setupControl(t, Config{})

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		events, err := control.EventList(ctx)
		require.NoError(t, err)
		require.Len(t, events, 1)
		require.Equal(t, "payment_intent.succeeded", events[0].Type)
		require.Equal(t, pi.ID, events[0].ObjectID)
		require.Equal(t, bundle.sim.EventList()[0].Payload, events[0].Payload)

		require.ErrorIs(t, control.EventResend(ctx, events[0].ID), ErrConflict, "no webhook URL")
		require.ErrorIs(t, control.EventResend(ctx, "evt_missing"), ErrNotFound)
	})

	t.Run("Faults", func(t *testing.T) {
		t.Parallel()
		bundle, control := setupControl(t, Config{})

		require.NoError(t, control.FaultAdd(ctx, Fault{Customer: "cus_a", Kind: FaultKindDecline, DeclineCode: "lost_card", Count: 1}))
		require.NoError(t, control.FaultAdd(ctx, Fault{Customer: FaultCustomerAll, Kind: FaultKindLatency, Latency: 5 * time.Millisecond, Count: 3}))
		faults, err := control.FaultList(ctx)
		require.NoError(t, err)
		require.Equal(t, []Fault{
			{Customer: "cus_a", Kind: FaultKindDecline, DeclineCode: "lost_card", Count: 1},
			{Customer: FaultCustomerAll, Kind: FaultKindLatency, Latency: 5 * time.Millisecond, Count: 3},
		}, faults)
		require.Equal(t, faults, bundle.sim.FaultList())

		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard, stripe.ErrorCodeCardDeclined)
		require.Equal(t, stripe.DeclineCode("lost_card"), stripeErr.DeclineCode)

		require.ErrorIs(t, control.FaultAdd(ctx, Fault{Customer: "cus_a", Kind: "nope"}), ErrInvalid)
		require.NoError(t, control.FaultClear(ctx))
		faults, err = control.FaultList(ctx)
		require.NoError(t, err)
		require.Empty(t, faults)
	})

	t.Run("Health", func(t *testing.T) {
		t.Parallel()
		_, control := setupControl(t, Config{})

		require.NoError(t, control.Health(ctx))
		require.Error(t, (&ControlClient{BaseURL: "http://127.0.0.1:1"}).Health(ctx))
	})

	t.Run("PaymentIntents", func(t *testing.T) {
		t.Parallel()
		bundle, control := setupControl(t, Config{})

		all, err := control.PaymentIntentList(ctx)
		require.NoError(t, err)
		require.Empty(t, all)

		require.NoError(t, control.FaultAdd(ctx, Fault{Customer: "cus_a", Kind: FaultKindError500AfterCreate, Count: 1}))
		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		_ = requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		require.NoError(t, control.FaultAdd(ctx, Fault{Customer: "cus_a", Kind: FaultKindProcessing, Count: 1}))
		processing, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 2000, "k2"))
		require.NoError(t, err)

		all, err = control.PaymentIntentList(ctx)
		require.NoError(t, err)
		require.Len(t, all, 2, "includes the PaymentIntent behind the 500")
		require.Equal(t, int64(1000), all[0].Amount)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, all[0].Status)
		require.Equal(t, processing.ID, all[1].ID)

		settled, err := control.PaymentIntentSettle(ctx, processing.ID, PaymentIntentSettleParams{Status: SettleStatusFailed})
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, settled.Status)
		require.Equal(t, stripe.DeclineCodeGenericDecline, settled.LastPaymentError.DeclineCode)
		_, err = control.PaymentIntentSettle(ctx, processing.ID, PaymentIntentSettleParams{Status: SettleStatusSucceeded})
		require.ErrorIs(t, err, ErrConflict)
		_, err = control.PaymentIntentSettle(ctx, "pi_missing", PaymentIntentSettleParams{Status: SettleStatusSucceeded})
		require.ErrorIs(t, err, ErrNotFound)
	})

	t.Run("Refunds", func(t *testing.T) {
		t.Parallel()
		bundle, control := setupControl(t, Config{})

		all, err := control.RefundList(ctx)
		require.NoError(t, err)
		require.Empty(t, all)

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		require.NoError(t, control.FaultAdd(ctx, Fault{Customer: "cus_a", Kind: FaultKindError500AfterCreate, Count: 1}))
		_, err = bundle.api.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(100)})
		_ = requireStripeError(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI, "")
		_, err = control.ChargeRefund(ctx, pi.LatestCharge.ID, 250)
		require.NoError(t, err)

		all, err = control.RefundList(ctx)
		require.NoError(t, err)
		require.Len(t, all, 2, "includes the refund behind the 500")
		require.Equal(t, int64(100), all[0].Amount)
		require.Equal(t, int64(250), all[1].Amount)
		require.Equal(t, pi.ID, all[1].PaymentIntent.ID)
		require.Equal(t, bundle.sim.RefundList(), all)

		stats, err := control.Stats(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, stats.RefundsCreated)

		require.NoError(t, control.Reset(ctx))
		all, err = control.RefundList(ctx)
		require.NoError(t, err)
		require.Empty(t, all)
	})

	t.Run("StatsAndReset", func(t *testing.T) {
		t.Parallel()
		bundle, control := setupControl(t, Config{Now: func() time.Time { return testBaseTime }})

		for range 2 {
			_, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
			require.NoError(t, err)
		}
		_, err := control.ClockAdvance(ctx, time.Hour)
		require.NoError(t, err)

		stats, err := control.Stats(ctx)
		require.NoError(t, err)
		require.Equal(t, bundle.sim.Stats(), stats)
		require.Equal(t, map[string]int{"succeeded": 1, "replayed": 1}, stats.Requests["POST /v1/payment_intents"])
		require.Equal(t, 1, stats.IdempotentReplays)
		require.Equal(t, 1, stats.PaymentIntentsCreated)
		require.Equal(t, 1, stats.EventsCreated)

		require.NoError(t, control.Reset(ctx))
		stats, err = control.Stats(ctx)
		require.NoError(t, err)
		require.Equal(t, Stats{Requests: map[string]map[string]int{}}, stats)
		require.Empty(t, bundle.sim.PaymentIntentList())
		require.Empty(t, bundle.sim.EventList())
		require.True(t, testBaseTime.Equal(bundle.sim.ClockNow()), "the clock offset is gone")

		// The key is forgotten too.
		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		require.Empty(t, pi.LastResponse.Header.Get("Idempotent-Replayed"))
	})

	t.Run("Webhooks", func(t *testing.T) {
		t.Parallel()
		rcv := newWebhookReceiver(t)
		bundle, control := setupControl(t, Config{WebhookSecret: testWebhookSecret})

		mode, err := control.WebhookModeGet(ctx)
		require.NoError(t, err)
		require.Equal(t, WebhookMode{ReorderWindow: WebhookReorderWindowDefault, ReorderFlush: WebhookReorderFlushDefault}, mode)

		mode, err = control.WebhookModeSet(ctx, WebhookMode{URL: rcv.server.URL, Duplicate: 1, Delay: time.Millisecond})
		require.NoError(t, err)
		require.Equal(t, WebhookMode{
			URL:           rcv.server.URL,
			Duplicate:     1,
			Delay:         time.Millisecond,
			ReorderWindow: WebhookReorderWindowDefault,
			ReorderFlush:  WebhookReorderFlushDefault,
		}, mode)
		_, err = control.WebhookModeSet(ctx, WebhookMode{Duplicate: 99})
		require.ErrorIs(t, err, ErrInvalid)

		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 1000, "k1"))
		require.NoError(t, err)
		first, second := rcv.next(t), rcv.next(t)
		require.Equal(t, first.ID, second.ID)

		require.NoError(t, control.EventResend(ctx, first.ID))
		require.Equal(t, first.ID, rcv.next(t).ID)
	})
}
