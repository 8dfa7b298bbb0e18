package jobs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/tally-billing/tally/internal/api"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
)

// webhookPost signs an event as Stripe does (at signedAt; zero: now) and
// posts it to Tally's webhook endpoint, returning the status and body.
func (b *testBundle) webhookPost(t *testing.T, url string, event map[string]any, secret string, signedAt time.Time) (int, string) {
	t.Helper()
	payload, err := json.Marshal(event)
	require.NoError(t, err)
	signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: secret, Timestamp: signedAt})
	req, err := http.NewRequest(http.MethodPost, url+"/v1/stripe/webhooks", bytes.NewReader(payload))
	require.NoError(t, err)
	req.Header.Set("Stripe-Signature", signed.Header)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.String()
}

func piEvent(id, typ, piID, status, chargeKey string) map[string]any {
	return map[string]any{
		"id": id, "object": "event", "type": typ, "created": time.Now().Unix(), "api_version": stripesim.APIVersion,
		"livemode": false, "pending_webhooks": 1,
		"data": map[string]any{"object": map[string]any{
			"id": piID, "object": "payment_intent", "status": status, "amount": 100, "currency": "usd", "customer": "cus_acme",
			"latest_charge": "ch_" + strings.TrimPrefix(piID, "pi_"),
			"metadata":      map[string]string{"tally_charge_key": chargeKey, "tally_namespace": "default"},
		}},
	}
}

func (b *testBundle) eventStatus(t *testing.T, ctx context.Context, id string) string {
	t.Helper()
	ev, err := b.Ledger.StripeEventGet(ctx, id)
	require.NoError(t, err)
	return ev.Status
}

func (b *testBundle) waitEvent(t *testing.T, ctx context.Context, id, status string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for b.eventStatus(t, ctx, id) != status {
		require.True(t, time.Now().Before(deadline), "event %s never became %s", id, status)
		time.Sleep(50 * time.Millisecond)
	}
}

// apiServer serves Tally's API (with the webhook endpoint) for the test.
func (b *testBundle) apiServer(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(api.NewServer(b.Logger, b.Ledger, func(context.Context) error { return nil }, webhookSecret))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestStripeWebhooks(t *testing.T) {
	t.Parallel()

	t.Run("AnotherNamespaceIsIgnored", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 100)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindProcessing})
		charge := b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeProcessing))
		url := b.apiServer(t)

		ev := piEvent("evt_staging", "payment_intent.succeeded", "pi_staging", "succeeded", charge.ChargeKey)
		ev["data"].(map[string]any)["object"].(map[string]any)["metadata"] = map[string]string{
			"tally_charge_key": charge.ChargeKey, "tally_namespace": "staging"}
		status, _ := b.webhookPost(t, url, ev, webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		b.waitEvent(t, ctx, "evt_staging", ledger.StripeEventIgnored)
		c, err := b.Ledger.ChargeGet(ctx, charge.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeProcessing, c.Status, "another deployment's PaymentIntent touches nothing")
	})

	t.Run("BadSignatureStoresNothing", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		url := b.apiServer(t)
		status, body := b.webhookPost(t, url, piEvent("evt_bad", "payment_intent.succeeded", "pi_1", "succeeded", "k"), "whsec_wrong", time.Time{})
		require.Equal(t, http.StatusBadRequest, status)
		require.Contains(t, body, "invalid_signature")
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.stripe_events`))
		require.Zero(t, b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'stripe_event'`))
	})

	t.Run("CrashBetweenStoreAndProcessing", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 100)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindProcessing})
		charge := b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeProcessing))
		require.NoError(t, b.worker.Stop(ctx)) // the processing side is down
		url := b.apiServer(t)

		status, _ := b.webhookPost(t, url, piEvent("evt_crash", "payment_intent.succeeded", *c.StripePaymentIntentID, "succeeded", charge.ChargeKey), webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, ledger.StripeEventReceived, b.eventStatus(t, ctx, "evt_crash"))
		// A processing attempt dies half-way: nothing it did is kept.
		err := b.Ledger.StripeEventHandle(ctx, "evt_crash", func(ctx context.Context, tx *ledger.Tx, ev *ledger.StripeEvent) (string, string, error) {
			_, err := b.Ledger.ChargeReconcileTx(ctx, tx, ledger.ChargeReconcileParams{ChargeID: charge.ID,
				Outcome: ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: *c.StripePaymentIntentID}, Actor: "test"})
			require.NoError(t, err)
			return "", "", errors.New("process died")
		})
		require.ErrorContains(t, err, "process died")
		require.Equal(t, ledger.StripeEventFailed, b.eventStatus(t, ctx, "evt_crash"))
		c, err = b.Ledger.ChargeGet(ctx, charge.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeProcessing, c.Status)

		b.startWorker(t, ctx) // the event's job runs: never dropped
		b.waitEvent(t, ctx, "evt_crash", ledger.StripeEventProcessed)
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, "webhook:evt_crash", *c.ResolvedBy)
	})

	t.Run("OutOfOrderNeverMovesBackwards", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 100)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindProcessing})
		charge := b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeProcessing))
		url := b.apiServer(t)
		pi := *c.StripePaymentIntentID

		status, _ := b.webhookPost(t, url, piEvent("evt_2", "payment_intent.succeeded", pi, "succeeded", charge.ChargeKey), webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		b.waitEvent(t, ctx, "evt_2", ledger.StripeEventProcessed)
		status, _ = b.webhookPost(t, url, piEvent("evt_1", "payment_intent.processing", pi, "processing", charge.ChargeKey), webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		b.waitEvent(t, ctx, "evt_1", ledger.StripeEventProcessed)

		c, err := b.Ledger.ChargeGet(ctx, charge.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeSucceeded, c.Status)
		require.Equal(t, "webhook:evt_2", *c.ResolvedBy)
	})

	t.Run("PaymentIntentNotTallysIsIgnored", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		url := b.apiServer(t)
		status, _ := b.webhookPost(t, url, piEvent("evt_other", "payment_intent.succeeded", "pi_other", "succeeded", ""), webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		b.waitEvent(t, ctx, "evt_other", ledger.StripeEventIgnored)
	})

	t.Run("PaymentIntentThatDiffersIsHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 100)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindProcessing})
		charge := b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeProcessing))
		url := b.apiServer(t)

		// The charge's key, but another amount: never its outcome.
		ev := piEvent("evt_other", "payment_intent.succeeded", "pi_elsewhere", "succeeded", charge.ChargeKey)
		ev["data"].(map[string]any)["object"].(map[string]any)["amount"] = 999
		status, _ := b.webhookPost(t, url, ev, webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		b.waitEvent(t, ctx, "evt_other", ledger.StripeEventProcessed)
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))
		require.Equal(t, ledger.HeldPaymentIntentMismatch, *c.HeldReason)
		require.Contains(t, *c.HeldDetail, "999 usd, not 100 usd")
		require.NotEqual(t, "pi_elsewhere", *c.StripePaymentIntentID)
	})

	t.Run("RefundsAndDisputesAreRecordedOnce", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{webhooks: true})
		b.customerWithEvents(t, ctx, "acme", 1000)
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		_, err := b.sim.ChargeRefund(*c.StripeChargeID, 300)
		require.NoError(t, err)
		_, err = b.sim.ChargeDispute(*c.StripeChargeID)
		require.NoError(t, err)
		for _, ev := range b.sim.EventList() { // every event delivered twice more
			require.NoError(t, b.sim.EventResend(ev.ID))
		}
		deadline := time.Now().Add(waitTimeout)
		for b.Count(t, `SELECT count(*) FROM billing.refunds`) == 0 || b.Count(t, `SELECT count(*) FROM billing.disputes`) == 0 {
			require.True(t, time.Now().Before(deadline), "refund or dispute never recorded")
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond) // let the resends land
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.refunds WHERE amount_cents = 300 AND charge_id = $1`, c.ID))
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.disputes WHERE charge_id = $1`, c.ID))
	})

	t.Run("ReplayedEventStoresNothingNew", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		url := b.apiServer(t)
		ev := piEvent("evt_once", "payment_intent.succeeded", "pi_x", "succeeded", "k")
		for i := range 3 {
			status, body := b.webhookPost(t, url, ev, webhookSecret, time.Time{})
			require.Equal(t, http.StatusOK, status)
			require.Contains(t, body, fmt.Sprintf(`"replay":%t`, i > 0))
		}
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.stripe_events`))
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'stripe_event'`))
		b.waitEvent(t, ctx, "evt_once", ledger.StripeEventIgnored)
	})

	t.Run("StaleTimestampRefused", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		url := b.apiServer(t)
		status, _ := b.webhookPost(t, url, piEvent("evt_old", "payment_intent.succeeded", "pi_1", "succeeded", "k"), webhookSecret, time.Now().Add(-301*time.Second))
		require.Equal(t, http.StatusBadRequest, status)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.stripe_events`))
	})

	t.Run("UnknownTypeIsIgnored", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		url := b.apiServer(t)
		ev := map[string]any{"id": "evt_cust", "object": "event", "type": "customer.created", "created": time.Now().Unix(),
			"data": map[string]any{"object": map[string]any{"id": "cus_1", "object": "customer"}}}
		status, _ := b.webhookPost(t, url, ev, webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		b.waitEvent(t, ctx, "evt_cust", ledger.StripeEventIgnored)
	})

	t.Run("WebhookResolvesUnknownBeforeWindow", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{webhooks: true})
		b.customerWithEvents(t, ctx, "acme", 300)
		// The PaymentIntent succeeds, the answer is a 500, replayed to every
		// retry: only the webhook can tell, long before the key window ends.
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500AfterCreate, Count: 1})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.True(t, strings.HasPrefix(*c.ResolvedBy, "webhook:evt_"), *c.ResolvedBy)
		require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID})
		b.waitJobsFinalized(t)
	})
}

func TestStripeWebhookRefundCreated(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	b.customerWithEvents(t, ctx, "acme", 1000)
	b.closeNow(t, ctx, "acme")
	c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	url := b.apiServer(t)
	ev := map[string]any{"id": "evt_re", "object": "event", "type": "refund.created", "created": time.Now().Unix(),
		"api_version": stripesim.APIVersion, "data": map[string]any{"object": map[string]any{
			"id": "re_1", "object": "refund", "amount": 250, "currency": "usd", "status": "succeeded",
			"charge": *c.StripeChargeID, "payment_intent": *c.StripePaymentIntentID, "created": time.Now().Unix(),
		}}}
	for range 2 {
		status, _ := b.webhookPost(t, url, ev, webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
	}
	b.waitEvent(t, ctx, "evt_re", ledger.StripeEventProcessed)
	require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.refunds WHERE stripe_refund_id = 're_1' AND amount_cents = 250 AND charge_id = $1`, c.ID))
}
