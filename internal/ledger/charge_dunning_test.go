package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestParseDunningSchedule(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	for in, want := range map[string][]time.Duration{
		"3d,5d,7d":     {3 * day, 5 * day, 7 * day},
		" 1d , 36h ":   {day, 36 * time.Hour},
		"90m,2.5d":     {90 * time.Minute, 60 * time.Hour},
		"":             nil,
		"2s,4s":        {2 * time.Second, 4 * time.Second},
		"0.5d,1d,1.5d": {12 * time.Hour, day, 36 * time.Hour},
	} {
		got, err := ledger.ParseDunningSchedule(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for in, why := range map[string]string{
		"3d,2d":   "must increase",
		"3d,3d":   "must increase",
		"3 days":  "not a duration",
		"-1d":     "positive",
		"0s":      "positive",
		"3d,,5d":  "not a duration",
		"weekly":  "not a duration",
		"1d,xd,2": "not a duration",
	} {
		_, err := ledger.ParseDunningSchedule(in)
		require.ErrorContains(t, err, why, in)
	}
	def, err := ledger.ParseDunningSchedule(ledger.DunningScheduleDefault)
	require.NoError(t, err)
	require.Equal(t, []time.Duration{3 * day, 5 * day, 7 * day}, def)
}

func TestDeclineRetryable(t *testing.T) {
	t.Parallel()
	failed := func(typ, code string) ledger.Outcome {
		return ledger.Outcome{Class: ledger.OutcomeFailed, ErrorType: typ, ErrorCode: code}
	}
	for _, o := range []ledger.Outcome{
		failed("card_error", "card_declined"), failed("card_error", "expired_card"),
		failed("card_error", "authentication_required"), failed("card_error", "incorrect_number"),
		failed("", "card_declined"), failed("", "insufficient_funds"), failed("", "requires_payment_method"),
		failed("", "requires_action"), failed("", "authentication_required"),
	} {
		require.True(t, ledger.DeclineRetryable(o), "%+v", o)
	}
	for _, o := range []ledger.Outcome{
		failed("invalid_request_error", "resource_missing"), failed("invalid_request_error", "parameter_missing"),
		failed("", "canceled"), failed("", "payment_intent_authentication_failure"),
		{Class: ledger.OutcomeUnknown, ErrorCode: "card_declined"}, {Class: ledger.OutcomeSucceeded},
	} {
		require.False(t, ledger.DeclineRetryable(o), "%+v", o)
	}
}

// TestChargeRetiredPaymentIntent covers the news of a PaymentIntent that a
// dunning retry canceled (Charge.RetiredPaymentIntentIDs).
func TestChargeRetiredPaymentIntent(t *testing.T) {
	t.Parallel()
	retire := func(t *testing.T, b *testBundle, chargeID int64, pi string) {
		t.Helper()
		_, err := b.Pool.Exec(t.Context(), `UPDATE billing.charges SET retired_payment_intent_ids = ARRAY[$2] WHERE id = $1`, chargeID, pi)
		require.NoError(t, err)
	}

	t.Run("LateNewsMovesNothing", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		retire(t, b, c.ID, "pi_old")
		a, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "webhook:evt_late",
			Outcome: ledger.Outcome{Class: ledger.OutcomeFailed, StripePaymentIntentID: "pi_old", ErrorCode: "card_declined"}})
		require.NoError(t, err)
		require.False(t, a.Changed)
		require.Equal(t, ledger.ChargePending, a.Charge.Status)
		require.Nil(t, a.Charge.StripePaymentIntentID)
	})

	t.Run("StaleProcessingMovesNothing", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		retire(t, b, c.ID, "pi_old")
		a, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "webhook:evt_stale",
			Outcome: ledger.Outcome{Class: ledger.OutcomeProcessing, StripePaymentIntentID: "pi_old"}})
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePending, a.Charge.Status, "the retry saw it canceled: processing news of it is stale")
	})

	t.Run("ItsSuccessIsAlerted", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		retire(t, b, c.ID, "pi_old")
		a, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "webhook:evt_odd",
			Outcome: ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_old"}})
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePending, a.Charge.Status)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.charge_transitions
WHERE charge_id = $1 AND reason LIKE 'ALERT%pi_old%canceled by a dunning retry%'`, c.ID), "a human is told")
	})

	t.Run("OwnCallAnsweringWithItHolds", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		claim := b.claimToCall(t, ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "a", LeaseTTL: time.Minute})
		retire(t, b, c.ID, "pi_old")
		got, err := b.Ledger.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeFailed,
			StripePaymentIntentID: "pi_old", ErrorType: "card_error", ErrorCode: "card_declined"}, "job:1/1", nil)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeHeld, got.Status, "the key was used before: calling again would replay it")
		require.Equal(t, ledger.HeldIdempotencyError, *got.HeldReason)
		require.Contains(t, *got.HeldDetail, "pi_old")
		require.Nil(t, got.LeaseOwner)
	})
}

// TestChargeRetryClaim covers the claim and the start of a past_due
// charge's retry (Claim.Retry, ChargeRetryBegin).
func TestChargeRetryClaim(t *testing.T) {
	t.Parallel()
	// pastDue returns acme's charge of 100, declined with a card error and
	// due for its retry (the ledger's clock moved an hour on).
	pastDue := func(t *testing.T) (context.Context, *testBundle, *ledger.Charge) {
		t.Helper()
		ctx, b := setup(t, setupOpts{ledger: ledger.Config{DunningSchedule: []time.Duration{time.Hour}}})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		c := b.close(t, ctx)
		_, err = b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "webhook:evt_1",
			Outcome: ledger.Outcome{Class: ledger.OutcomeFailed, StripePaymentIntentID: "pi_declined", ErrorType: "card_error", ErrorCode: "card_declined"}})
		require.NoError(t, err)
		b.Clock.Advance(time.Hour)
		c, err = b.Ledger.ChargeGet(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePastDue, c.Status)
		return ctx, b, c
	}
	claim := func(ctx context.Context, b *testBundle, c *ledger.Charge) (*ledger.Claim, error) {
		return b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
	}

	t.Run("GuardsAChargeWithoutReservation", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := pastDue(t)
		// Declined before any claim reserved its amount (a webhook after a
		// restore), and above the customer's cap since.
		_, err := b.Pool.Exec(ctx, `UPDATE billing.charges SET budget_reserved = false WHERE id = $1`, c.ID)
		require.NoError(t, err)
		limit := int64(50)
		_, _, err = b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd", MaxChargeCents: &limit})
		require.NoError(t, err)
		cl, err := claim(ctx, b, c)
		require.NoError(t, err)
		require.Nil(t, cl, "held by its guards: nothing to retry")
		got, err := b.Ledger.ChargeGet(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeHeld, got.Status)
		require.Equal(t, ledger.HeldOverCustomerCap, *got.HeldReason)
	})

	t.Run("KillSwitchStopsTheNextGeneration", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := pastDue(t)
		cl, err := claim(ctx, b, c)
		require.NoError(t, err)
		require.True(t, cl.Retry)
		// Paused while the retry cancels on Stripe.
		_, err = b.Ledger.ChargingPause(ctx, "operator:test", "incident")
		require.NoError(t, err)
		_, err = b.Ledger.ChargeRetryBegin(ctx, cl, ledger.ChargeRetryBeginParams{Retired: []string{"pi_declined"}, Actor: "job:1/1"})
		require.ErrorIs(t, err, ledger.ErrChargingPaused)
		got, err := b.Ledger.ChargeGet(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePastDue, got.Status)
		require.Zero(t, got.KeyGeneration, "no next generation while paused")
	})

	t.Run("NamingNoPaymentIntentTakesTheOneThatMoved", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := pastDue(t)
		// A decline answered without its PaymentIntent.
		_, err := b.Pool.Exec(ctx, `UPDATE billing.charges SET stripe_payment_intent_id = NULL WHERE id = $1`, c.ID)
		require.NoError(t, err)
		a, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "reconciler",
			Outcome: ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_paid"}})
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeSucceeded, a.Charge.Status)
		require.Equal(t, "pi_paid", *a.Charge.StripePaymentIntentID)
	})
}
