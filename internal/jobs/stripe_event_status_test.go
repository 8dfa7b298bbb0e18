package jobs_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
)

// waitSimEventsDone waits until every event the simulator emitted is stored
// and processed or ignored.
func (b *testBundle) waitSimEventsDone(t *testing.T, ctx context.Context) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for _, ev := range b.sim.EventList() {
		for {
			stored, err := b.Ledger.StripeEventGet(ctx, ev.ID)
			if err == nil && (stored.Status == ledger.StripeEventProcessed || stored.Status == ledger.StripeEventIgnored) {
				break
			}
			require.True(t, time.Now().Before(deadline), "event %s (%s) never processed", ev.ID, ev.Type)
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func TestStripeWebhookRefundAndDisputeStatus(t *testing.T) {
	t.Parallel()

	t.Run("DisputeFundsWithdrawnAndReinstated", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 1000)
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		url := b.apiServer(t)
		created := time.Now().Unix()
		due := created + 7*24*3600
		disputeEvent := func(id, typ, status string, at int64) map[string]any {
			return map[string]any{"id": id, "object": "event", "type": typ, "created": at,
				"api_version": stripesim.APIVersion, "data": map[string]any{"object": map[string]any{
					"id": "dp_1", "object": "dispute", "amount": 1000, "currency": "usd", "status": status,
					"reason": "fraudulent", "charge": *c.StripeChargeID, "payment_intent": *c.StripePaymentIntentID,
					"created": created, "evidence_details": map[string]any{"due_by": due},
				}}}
		}
		for _, ev := range []map[string]any{
			disputeEvent("evt_won", "charge.dispute.closed", "won", created+600),
			disputeEvent("evt_in", "charge.dispute.funds_reinstated", "won", created+600),
			disputeEvent("evt_new", "charge.dispute.created", "needs_response", created),
			disputeEvent("evt_out", "charge.dispute.funds_withdrawn", "needs_response", created+1),
			disputeEvent("evt_rev", "charge.dispute.updated", "under_review", created+300),
		} {
			status, _ := b.webhookPost(t, url, ev, webhookSecret, time.Time{})
			require.Equal(t, http.StatusOK, status)
			b.waitEvent(t, ctx, ev["id"].(string), ledger.StripeEventProcessed)
		}

		dispute, err := b.Ledger.DisputeGet(ctx, "dp_1")
		require.NoError(t, err)
		require.Equal(t, "won", dispute.Status)
		require.Equal(t, time.Unix(due, 0).UTC(), dispute.EvidenceDueBy.UTC())
		require.Equal(t, time.Unix(created+1, 0).UTC(), dispute.FundsWithdrawnAt.UTC())
		require.Equal(t, time.Unix(created+600, 0).UTC(), dispute.FundsReinstatedAt.UTC())
	})

	t.Run("FailedRefundAndLostDisputeDuplicatedAndReordered", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{webhooks: true})
		b.customerWithEvents(t, ctx, "acme", 1000)
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		_, err := b.sim.WebhookModeSet(stripesim.WebhookMode{Duplicate: 1, Reorder: true})
		require.NoError(t, err)

		ch, err := b.sim.ChargeRefund(*c.StripeChargeID, 300)
		require.NoError(t, err)
		re := ch.Refunds.Data[0]
		b.Clock.Advance(time.Hour) // Stripe learns a day later that the card is closed
		_, err = b.sim.RefundUpdate(re.ID, "failed")
		require.NoError(t, err)
		dp, err := b.sim.ChargeDispute(*c.StripeChargeID)
		require.NoError(t, err)
		_, err = b.sim.DisputeUpdate(dp.ID, "under_review")
		require.NoError(t, err)
		_, err = b.sim.DisputeUpdate(dp.ID, "lost")
		require.NoError(t, err)
		b.waitSimEventsDone(t, ctx)

		refund, err := b.Ledger.RefundGet(ctx, re.ID)
		require.NoError(t, err)
		require.Equal(t, "failed", refund.Status)
		require.Equal(t, c.ID, *refund.ChargeID)
		dispute, err := b.Ledger.DisputeGet(ctx, dp.ID)
		require.NoError(t, err)
		require.Equal(t, "lost", dispute.Status)
		require.Equal(t, "charge.dispute.closed", *dispute.StatusEventType)

		// Every event delivered once more, in another order: nothing moves.
		for _, ev := range b.sim.EventList() {
			require.NoError(t, b.sim.EventResend(ev.ID))
		}
		time.Sleep(500 * time.Millisecond) // let the resends land
		refund, err = b.Ledger.RefundGet(ctx, re.ID)
		require.NoError(t, err)
		require.Equal(t, "failed", refund.Status)
		dispute, err = b.Ledger.DisputeGet(ctx, dp.ID)
		require.NoError(t, err)
		require.Equal(t, "lost", dispute.Status)
		// refund.created, charge.refunded, refund.updated, charge.refund.updated
		require.Equal(t, int64(4), b.Count(t, `SELECT count(*) FROM billing.refund_events WHERE stripe_refund_id = $1`, re.ID))
		require.Equal(t, int64(3), b.Count(t, `SELECT count(*) FROM billing.dispute_events WHERE stripe_dispute_id = $1`, dp.ID))
	})

	t.Run("PendingRefundSucceedsUpdateFirst", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 1000)
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		url := b.apiServer(t)
		created := time.Now().Unix()
		refundEvent := func(id, typ, status string, at int64) map[string]any {
			return map[string]any{"id": id, "object": "event", "type": typ, "created": at,
				"api_version": stripesim.APIVersion, "data": map[string]any{"object": map[string]any{
					"id": "re_p", "object": "refund", "amount": 250, "currency": "usd", "status": status,
					"charge": *c.StripeChargeID, "payment_intent": *c.StripePaymentIntentID, "created": created,
				}}}
		}
		// Stripe's later charge.refund.updated arrives before refund.created.
		status, _ := b.webhookPost(t, url, refundEvent("evt_upd", "charge.refund.updated", "succeeded", created+90), webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		b.waitEvent(t, ctx, "evt_upd", ledger.StripeEventProcessed)
		status, _ = b.webhookPost(t, url, refundEvent("evt_new", "refund.created", "pending", created), webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		b.waitEvent(t, ctx, "evt_new", ledger.StripeEventProcessed)

		refund, err := b.Ledger.RefundGet(ctx, "re_p")
		require.NoError(t, err)
		require.Equal(t, "succeeded", refund.Status)
		require.Equal(t, "evt_upd", *refund.StatusEventID)
		require.Equal(t, int64(250), refund.AmountCents)
	})
}
