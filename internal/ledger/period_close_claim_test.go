package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// closeClaim runs PeriodCloseClaim on acme's November as worker run owner
// does, having looked up payment method pm of acme's Stripe customer
// (lookedUp).
func (b *testBundle) closeClaim(ctx context.Context, owner, pm string, lookedUp bool) (*ledger.ClosedClaim, error) {
	of := ""
	if lookedUp {
		of = "cus_acme"
	}
	return b.closeClaimOf(ctx, owner, pm, of)
}

// closeClaimOf is closeClaim with payment method pm looked up for Stripe
// customer of.
func (b *testBundle) closeClaimOf(ctx context.Context, owner, pm, of string) (*ledger.ClosedClaim, error) {
	return b.Ledger.PeriodCloseClaim(ctx, ledger.PeriodCloseClaimParams{
		Close:           ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"},
		Claim:           ledger.ChargeClaimParams{Owner: owner, LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1, PaymentMethodID: pm},
		PaymentMethodOf: of,
	})
}

// requireClosedUnclaimed checks that acme's November is closed (an event is
// refused) and its charge pending without a lease or an attempt.
func (b *testBundle) requireClosedUnclaimed(t *testing.T, ctx context.Context) *ledger.Charge {
	t.Helper()
	_, err := b.Ledger.UsageEventRecord(ctx, event("late", 1))
	requireConflict(t, err, ledger.ConflictPeriodClosed)
	c, err := b.Ledger.ChargeGetByPeriod(ctx, "acme", "2026-11")
	require.NoError(t, err)
	require.Equal(t, ledger.ChargePending, c.Status)
	require.Nil(t, c.LeaseOwner)
	require.Zero(t, c.AttemptCount)
	return c
}

func TestPeriodCloseClaim(t *testing.T) {
	t.Parallel()

	t.Run("ClosesAndClaimsInOneTransaction", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)

		cc, err := b.closeClaim(ctx, "a", "pm_1", true)
		require.NoError(t, err)
		require.False(t, cc.NeedsPaymentMethod)
		require.NotNil(t, cc.Claim)
		require.True(t, cc.Claim.Lookup, "a new charge's key is not proven fresh: look at Stripe first")
		c := cc.Charge
		require.Equal(t, cc.Claim.Charge, c)
		require.Equal(t, ledger.ChargePending, c.Status)
		require.Equal(t, int64(100), c.AmountCents)
		require.Equal(t, "a", *c.LeaseOwner)
		require.Equal(t, "pm_1", *c.StripePaymentMethodID)
		require.Equal(t, 1, c.AttemptCount)
		require.True(t, c.BudgetReserved)
		_, err = b.Ledger.UsageEventRecord(ctx, event("late", 1))
		requireConflict(t, err, ledger.ConflictPeriodClosed)
		require.Equal(t, int64(1), b.Count(t, "SELECT count(*) FROM billing.charges"))

		// A second run (a rescued job) finds the period closed, the charge
		// there and its lease live: nothing changes.
		_, err = b.closeClaim(ctx, "b", "pm_2", true)
		var held *ledger.LeaseHeldError
		require.ErrorAs(t, err, &held)
		require.Equal(t, "a", held.Owner)
		got, err := b.Ledger.ChargeGet(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, 1, got.AttemptCount)
		require.Equal(t, "pm_1", *got.StripePaymentMethodID)
	})

	t.Run("CommitsTheCloseWhenChargingIsPaused", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		_, err = b.Ledger.ChargingPause(ctx, "operator:ops/tly_1", "incident 42")
		require.NoError(t, err)

		_, err = b.closeClaim(ctx, "a", "", true)
		require.ErrorIs(t, err, ledger.ErrChargingPaused)
		b.requireClosedUnclaimed(t, ctx)

		_, err = b.Ledger.ChargingResume(ctx, "cli:ops", "incident over")
		require.NoError(t, err)
		cc, err := b.closeClaim(ctx, "a", "", true)
		require.NoError(t, err)
		require.NotNil(t, cc.Claim)
	})

	t.Run("NeedsThePaymentMethodLookedUp", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)

		// The caller found the customer's payment method registered, but it
		// went away before the close: nothing is claimed without one.
		cc, err := b.closeClaim(ctx, "a", "", false)
		require.NoError(t, err)
		require.True(t, cc.NeedsPaymentMethod)
		require.Nil(t, cc.Claim)
		b.requireClosedUnclaimed(t, ctx)

		stripeCustomer, err := b.Ledger.ChargePaymentMethodNeeded(ctx, "acme", "2026-11")
		require.NoError(t, err)
		require.Equal(t, "cus_acme", stripeCustomer)

		// A payment method of the Stripe customer acme had before is not
		// the charge's.
		cc, err = b.closeClaimOf(ctx, "a", "pm_old", "cus_old")
		require.NoError(t, err)
		require.True(t, cc.NeedsPaymentMethod)
		b.requireClosedUnclaimed(t, ctx)

		cc, err = b.closeClaim(ctx, "a", "pm_1", true)
		require.NoError(t, err)
		require.Equal(t, "pm_1", *cc.Charge.StripePaymentMethodID)
	})

	t.Run("SettledChargeNeedsNoClaim", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		cc, err := b.closeClaim(ctx, "a", "", true)
		require.NoError(t, err)
		claim, err := b.Ledger.ChargeLookupNone(ctx, cc.Claim, "job:1/1")
		require.NoError(t, err)
		_, err = b.Ledger.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeFailed, ErrorCode: "card_declined"}, "job:1/1", nil)
		require.NoError(t, err)

		cc, err = b.closeClaim(ctx, "b", "", false)
		require.NoError(t, err)
		require.Nil(t, cc.Claim)
		require.False(t, cc.NeedsPaymentMethod)
		require.Equal(t, ledger.ChargeFailed, cc.Charge.Status)
	})
}

func TestChargePaymentMethodNeeded(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	needed := func(customer string) string {
		t.Helper()
		stripeCustomer, err := b.Ledger.ChargePaymentMethodNeeded(ctx, customer, "2026-11")
		require.NoError(t, err)
		return stripeCustomer
	}

	// Before the charge exists, the customer's registration decides.
	require.Equal(t, "cus_acme", needed("acme"), "no payment method registered")
	pm := "pm_registered"
	_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "beta", StripeCustomerID: "cus_beta",
		StripePaymentMethodID: &pm, Currency: "usd"})
	require.NoError(t, err)
	require.Empty(t, needed("beta"), "registered")
	require.Empty(t, needed("nobody"), "no such customer")

	// Once the charge exists, the charge decides: a charge attempted once
	// keeps the parameters it was attempted with.
	_, err = b.Ledger.UsageEventRecord(ctx, event("e1", 100))
	require.NoError(t, err)
	c := b.close(t, ctx)
	require.Equal(t, "cus_acme", needed("acme"))
	_, err = b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "a", LeaseTTL: time.Minute})
	require.NoError(t, err)
	require.Empty(t, needed("acme"), "attempted without one")
}
