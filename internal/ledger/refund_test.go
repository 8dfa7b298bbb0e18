package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// adjustmentBundle is a ledger with acme's November charge paid by
// PaymentIntent pi_1 (Stripe charge ch_1).
func adjustmentBundle(t *testing.T) (context.Context, *testBundle, *ledger.Charge) {
	t.Helper()
	ctx, b := setup(t, setupOpts{})
	_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "e1", AmountCents: 1000})
	require.NoError(t, err)
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `UPDATE billing.charges SET stripe_payment_intent_id = 'pi_1', stripe_charge_id = 'ch_1' WHERE id = $1`, c.ID)
	require.NoError(t, err)
	return ctx, b, c
}

// t0 is when the refunds and disputes of these tests were created on Stripe.
var t0 = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)

// refundEvent is what a Stripe event evtID of type typ, created at, shows of
// refund re_1 of ch_1: status.
func refundEvent(evtID, typ, status string, at time.Time) ledger.ChargeAdjustmentParams {
	return ledger.ChargeAdjustmentParams{
		StripeID: "re_1", StripeChargeID: "ch_1", StripePaymentIntentID: "pi_1", AmountCents: 300, Currency: "usd",
		Status: status, CreatedAt: t0, EventID: evtID, EventType: typ, EventCreatedAt: at,
	}
}

// recordRefund applies events in the order given, each in its own
// transaction as the webhook worker does, and returns the refund.
func recordRefund(t *testing.T, ctx context.Context, b *testBundle, events ...ledger.ChargeAdjustmentParams) *ledger.Refund {
	t.Helper()
	for _, p := range events {
		require.NoError(t, b.Ledger.InTx(ctx, func(tx *ledger.Tx) error {
			_, err := b.Ledger.RefundRecordTx(ctx, tx, p)
			return err
		}))
	}
	r, err := b.Ledger.RefundGet(ctx, "re_1")
	require.NoError(t, err)
	return r
}

func TestRefundStatus(t *testing.T) {
	t.Parallel()

	created := refundEvent("evt_1", "refund.created", "pending", t0)
	succeeded := refundEvent("evt_2", "charge.refund.updated", "succeeded", t0.Add(time.Minute))
	failed := refundEvent("evt_3", "charge.refund.updated", "failed", t0.Add(time.Hour))
	failed.FailureReason = "expired_or_canceled_card"

	t.Run("AppendOnly", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := adjustmentBundle(t)
		recordRefund(t, ctx, b, created)
		_, err := b.Pool.Exec(ctx, `UPDATE billing.refund_events SET status = 'succeeded'`)
		require.ErrorContains(t, err, "append-only")
		_, err = b.Pool.Exec(ctx, `DELETE FROM billing.refund_events`)
		require.ErrorContains(t, err, "append-only")
	})

	t.Run("DuplicatesAndReplaysNeverMoveItBackwards", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := adjustmentBundle(t)
		r := recordRefund(t, ctx, b, created, succeeded, created, succeeded, failed, succeeded, created)
		require.Equal(t, "failed", r.Status)
		require.Equal(t, "expired_or_canceled_card", *r.FailureReason)
		require.Equal(t, "evt_3", *r.StatusEventID)
		require.Equal(t, c.ID, *r.ChargeID)
		require.Equal(t, int64(300), r.AmountCents)
		require.Equal(t, int64(3), b.Count(t, `SELECT count(*) FROM billing.refund_events`), "one row per event")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.refunds`))
	})

	t.Run("PendingThenSucceeded", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := adjustmentBundle(t)
		r := recordRefund(t, ctx, b, created)
		require.Equal(t, "pending", r.Status)
		r = recordRefund(t, ctx, b, succeeded)
		require.Equal(t, "succeeded", r.Status)
		require.Equal(t, "charge.refund.updated", *r.StatusEventType)
		require.True(t, t0.Add(time.Minute).Equal(*r.StatusObservedAt))
	})

	t.Run("ReorderedUpdateFirst", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := adjustmentBundle(t)
		r := recordRefund(t, ctx, b, succeeded, created)
		require.Equal(t, "succeeded", r.Status)
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.refund_events`))
	})

	t.Run("ResolveRefundGetsItsUpdates", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := adjustmentBundle(t)
		// A resolve refunded another PaymentIntent carrying the charge's key.
		other := ledger.ChargeAdjustmentParams{StripeID: "re_1", StripeChargeID: "ch_other", StripePaymentIntentID: "pi_other",
			AmountCents: 300, Currency: "usd", Status: "pending", Reason: "duplicate", CreatedAt: t0}
		_, err := b.Ledger.RefundRecordResolve(ctx, c.ID, other)
		require.NoError(t, err)
		again, err := b.Ledger.RefundRecordResolve(ctx, c.ID, other)
		require.NoError(t, err)
		require.False(t, again, "the resolve's answer is recorded once")
		_, err = b.Ledger.RefundRecordResolve(ctx, 999_999, other)
		require.ErrorIs(t, err, ledger.ErrNotFound)

		update := other
		update.Status, update.EventID, update.EventType, update.EventCreatedAt = "succeeded", "evt_9", "charge.refund.updated", t0.Add(time.Minute)
		r := recordRefund(t, ctx, b, update)
		require.Equal(t, "succeeded", r.Status, "the refund of a PaymentIntent the charge does not name is found by its id")
		require.Equal(t, c.ID, *r.ChargeID)
	})

	t.Run("SameRankLatestEventWins", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := adjustmentBundle(t)
		action := refundEvent("evt_a", "refund.created", "requires_action", t0)
		pending := refundEvent("evt_b", "refund.updated", "pending", t0.Add(time.Minute))
		r := recordRefund(t, ctx, b, pending, action)
		require.Equal(t, "pending", r.Status)
	})

	t.Run("KnownWithoutItsChargeStaysItsCustomers", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := adjustmentBundle(t)
		// A refund recorded before migration 00034 without its charge, which
		// the migration gave the customer acme; the ledger says ch_1 is now
		// another customer's (inconsistent, but it must not split the refund).
		b.Customer(t, "beta")
		_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "beta", EventID: "e1", AmountCents: 500})
		require.NoError(t, err)
		beta, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "beta", Period: "2026-11", Actor: "job:2/1"})
		require.NoError(t, err)
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`UPDATE billing.charges SET stripe_payment_intent_id = NULL, stripe_charge_id = NULL WHERE customer_id = 'acme'`, nil},
			{`UPDATE billing.charges SET stripe_payment_intent_id = 'pi_1', stripe_charge_id = 'ch_1' WHERE id = $1`, []any{beta.ID}},
			{`INSERT INTO billing.refunds (stripe_refund_id, charge_id, customer_id, stripe_charge_id, amount_cents, currency,
                             stripe_created_at, recorded_at)
VALUES ('re_1', NULL, 'acme', 'ch_1', 300, 'usd', $1, $1)`, []any{t0}},
		} {
			_, err = b.Pool.Exec(ctx, q.sql, q.args...)
			require.NoError(t, err)
		}
		recordRefund(t, ctx, b, refundEvent("evt_1", "refund.updated", "succeeded", t0))
		require.Equal(t, "acme", b.text(t, `SELECT string_agg(customer_id, ',') FROM billing.refunds WHERE stripe_refund_id = 're_1'`))
		require.Equal(t, "acme", b.text(t, `SELECT string_agg(customer_id, ',') FROM billing.refund_events WHERE stripe_refund_id = 're_1'`))
	})

	t.Run("UnknownChargeIsNotFound", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := adjustmentBundle(t)
		p := refundEvent("evt_x", "refund.created", "succeeded", t0)
		p.StripeChargeID, p.StripePaymentIntentID = "ch_other", "pi_other"
		err := b.Ledger.InTx(ctx, func(tx *ledger.Tx) error {
			_, err := b.Ledger.RefundRecordTx(ctx, tx, p)
			return err
		})
		require.True(t, errors.Is(err, ledger.ErrNotFound), "%v", err)
		_, err = b.Ledger.RefundGet(ctx, "re_1")
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

// disputeEvent is what a Stripe event shows of dispute dp_1 of ch_1.
func disputeEvent(evtID, typ, status string, at time.Time) ledger.ChargeAdjustmentParams {
	due := t0.Add(7 * 24 * time.Hour)
	return ledger.ChargeAdjustmentParams{
		StripeID: "dp_1", StripeChargeID: "ch_1", StripePaymentIntentID: "pi_1", AmountCents: 1000, Currency: "usd",
		Status: status, Reason: "fraudulent", CreatedAt: t0, EventID: evtID, EventType: typ, EventCreatedAt: at,
		EvidenceDueBy: &due,
	}
}

func recordDispute(t *testing.T, ctx context.Context, b *testBundle, events ...ledger.ChargeAdjustmentParams) *ledger.Dispute {
	t.Helper()
	for _, p := range events {
		require.NoError(t, b.Ledger.InTx(ctx, func(tx *ledger.Tx) error {
			_, err := b.Ledger.DisputeRecordTx(ctx, tx, p)
			return err
		}))
	}
	d, err := b.Ledger.DisputeGet(ctx, "dp_1")
	require.NoError(t, err)
	return d
}

func TestDisputeStatus(t *testing.T) {
	t.Parallel()

	created := disputeEvent("evt_1", "charge.dispute.created", "needs_response", t0)
	withdrawn := disputeEvent("evt_2", "charge.dispute.funds_withdrawn", "needs_response", t0.Add(time.Second))
	review := disputeEvent("evt_3", "charge.dispute.updated", "under_review", t0.Add(24*time.Hour))
	won := disputeEvent("evt_4", "charge.dispute.closed", "won", t0.Add(30*24*time.Hour))
	reinstated := disputeEvent("evt_5", "charge.dispute.funds_reinstated", "won", t0.Add(30*24*time.Hour))

	t.Run("ClosedInOrder", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := adjustmentBundle(t)
		d := recordDispute(t, ctx, b, created)
		require.Equal(t, "needs_response", d.Status)
		require.True(t, t0.Add(7*24*time.Hour).Equal(*d.EvidenceDueBy))
		require.Nil(t, d.FundsWithdrawnAt)
		d = recordDispute(t, ctx, b, withdrawn, review, won, reinstated)
		require.Equal(t, "won", d.Status)
		require.Equal(t, c.ID, *d.ChargeID)
		require.True(t, t0.Add(time.Second).Equal(*d.FundsWithdrawnAt))
		require.True(t, t0.Add(30*24*time.Hour).Equal(*d.FundsReinstatedAt))
	})

	t.Run("InquiryEscalates", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := adjustmentBundle(t)
		inquiry := disputeEvent("evt_1", "charge.dispute.created", "warning_needs_response", t0)
		escalated := disputeEvent("evt_2", "charge.dispute.updated", "needs_response", t0.Add(time.Hour))
		lost := disputeEvent("evt_3", "charge.dispute.closed", "lost", t0.Add(48*time.Hour))
		d := recordDispute(t, ctx, b, inquiry, escalated)
		require.Equal(t, "needs_response", d.Status)
		d = recordDispute(t, ctx, b, lost)
		require.Equal(t, "lost", d.Status)
	})

	t.Run("ReorderedAndDuplicatedNeverMoveItBackwards", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := adjustmentBundle(t)
		d := recordDispute(t, ctx, b, won, review, won, created, withdrawn, created, review)
		require.Equal(t, "won", d.Status)
		require.Equal(t, "evt_4", *d.StatusEventID)
		require.NotNil(t, d.FundsWithdrawnAt)
		require.Equal(t, int64(4), b.Count(t, `SELECT count(*) FROM billing.dispute_events`), "one row per event")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.disputes`))
		_, err := b.Pool.Exec(ctx, `UPDATE billing.dispute_events SET status = 'lost'`)
		require.ErrorContains(t, err, "append-only")
	})
}

func TestAdjustmentNotified(t *testing.T) {
	t.Parallel()
	ctx, b, c := adjustmentBundle(t)
	b.subscribe(t, ctx, ledger.NotifyChargeRefunded, ledger.NotifyChargeDisputed)

	// One notification per refund and per dispute, however many events
	// show them, written in the event's transaction.
	recordRefund(t, ctx, b, refundEvent("evt_1", "refund.created", "pending", t0),
		refundEvent("evt_2", "charge.refund.updated", "succeeded", t0.Add(time.Minute)))
	recordDispute(t, ctx, b, disputeEvent("evt_3", "charge.dispute.created", "needs_response", t0),
		disputeEvent("evt_4", "charge.dispute.closed", "lost", t0.Add(time.Hour)))
	require.ElementsMatch(t, []string{ledger.NotifyChargeRefunded, ledger.NotifyChargeDisputed}, b.notifications(t, ctx))
	require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.notifications WHERE (body->'data'->'object'->>'id')::bigint = $1`, c.ID))
}
