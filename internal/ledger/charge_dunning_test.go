package ledger_test

import (
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
