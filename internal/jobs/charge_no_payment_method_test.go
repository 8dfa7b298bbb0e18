package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// TestChargeNoPaymentMethod charges a customer that has no payment method
// (none registered in Tally, no default on Stripe): Stripe refuses the
// call, and the charge waits for one instead of failing for good.
func TestChargeNoPaymentMethod(t *testing.T) {
	t.Parallel()

	t.Run("HeldWithoutDunningThenApproved", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.sim.CustomerSetDefaultPaymentMethod("cus_acme", "")
		require.NoError(t, err)
		b.customerWithEvents(t, ctx, "acme", 700)
		b.closeNow(t, ctx, "acme")

		c := b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.Status != ledger.ChargePending })
		require.Equal(t, ledger.ChargeHeld, c.Status, "%+v", c)
		require.Equal(t, ledger.HeldNoPaymentMethod, *c.HeldReason)
		require.Empty(t, b.sim.PaymentIntentList(), "Stripe created nothing")
		require.True(t, c.HeldReason.Approvable())

		// The customer adds a card on Stripe; the operator approves.
		_, err = b.sim.CustomerSetDefaultPaymentMethod("cus_acme", "pm_card_mastercard")
		require.NoError(t, err)
		_, err = b.Ledger.ChargeApprove(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:test", Reason: "card added"})
		require.NoError(t, err)
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, "pm_card_mastercard", *c.StripePaymentMethodID, "the default looked up for the approved call")
		require.Equal(t, 1, c.KeyGeneration, "the refused call's key is not reused")
		require.Len(t, b.sim.PaymentIntentList(), 1)
		b.waitJobsFinalized(t)
	})

	t.Run("PastDueThenRetried", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{ledger: ledger.Config{DunningSchedule: dunningSchedule}})
		_, err := b.sim.CustomerSetDefaultPaymentMethod("cus_acme", "")
		require.NoError(t, err)
		b.customerWithEvents(t, ctx, "acme", 700)
		b.closeNow(t, ctx, "acme")

		c := b.waitCharge(t, ctx, "acme", pastDue(0))
		require.Equal(t, ledger.FailureNoPaymentMethod, *c.FailureCode)
		require.NotNil(t, c.NextRetryAt)
		require.Empty(t, b.sim.PaymentIntentList())

		// The producer registers the customer's new card and asks for the
		// retry now.
		_, _, err = b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme",
			StripePaymentMethodID: ptr("pm_card_visa"), Currency: "usd"})
		require.NoError(t, err)
		_, err = b.Ledger.ChargeRetryNow(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:test"})
		require.NoError(t, err)
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, "pm_card_visa", *c.StripePaymentMethodID)
		require.Len(t, b.sim.PaymentIntentList(), 1)
		require.Equal(t, []string{"failed", "succeeded"}, b.attempts(t, ctx, c.ID))
	})
}

func ptr[T any](v T) *T { return &v }
