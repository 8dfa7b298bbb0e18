package ledger_test

import (
	"context"
	"fmt"
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

		pf, err := b.Ledger.ChargePreflight(ctx, "acme", "2026-11")
		require.NoError(t, err)
		require.Equal(t, "cus_acme", pf.PaymentMethodOf)

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

func TestChargePreflight(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	preflight := func(customer string) ledger.Preflight {
		t.Helper()
		pf, err := b.Ledger.ChargePreflight(ctx, customer, "2026-11")
		require.NoError(t, err)
		return pf
	}

	t.Run("PaymentMethod", func(t *testing.T) {
		// Before the charge exists, the customer's registration decides.
		require.Equal(t, "cus_acme", preflight("acme").PaymentMethodOf, "no payment method registered")
		pm := "pm_registered"
		_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "beta", StripeCustomerID: "cus_beta",
			StripePaymentMethodID: &pm, Currency: "usd"})
		require.NoError(t, err)
		require.Empty(t, preflight("beta").PaymentMethodOf, "registered")
		require.Equal(t, ledger.Preflight{}, preflight("nobody"), "no such customer")
	})

	t.Run("LookupBeforeTheChargeExists", func(t *testing.T) {
		require.Nil(t, preflight("acme").Lookup, "no period")
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		pf := preflight("acme")
		require.NotNil(t, pf.Lookup)
		require.Equal(t, "cus_acme", pf.Lookup.StripeCustomerID)
		require.NotEmpty(t, pf.Lookup.ChargeKey)

		// The charge the close creates is the one looked up.
		c := b.close(t, ctx)
		require.True(t, pf.Lookup.Is(c.LookupTarget()), "%+v is not %+v", *pf.Lookup, c.LookupTarget())
		require.True(t, preflight("acme").Lookup.Is(c.LookupTarget()), "never attempted")
	})

	t.Run("NoLookupOnceAttemptedOrMarked", func(t *testing.T) {
		c, err := b.Ledger.ChargeGetByPeriod(ctx, "acme", "2026-11")
		require.NoError(t, err)
		claim, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "a", LeaseTTL: time.Minute})
		require.NoError(t, err)
		require.NotNil(t, preflight("acme").Lookup, "claimed, its key not used yet")
		_, err = b.Ledger.ChargeLookupNone(ctx, claim, "job:1/1")
		require.NoError(t, err)
		pf := preflight("acme")
		require.Nil(t, pf.Lookup, "an attempt of the generation is on record")
		require.Empty(t, pf.PaymentMethodOf, "attempted without one")
	})

	t.Run("NoLookupForAnEmptyPeriod", func(t *testing.T) {
		b.Customer(t, "idle")
		_, err := b.Pool.Exec(ctx, `
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, created_at)
VALUES ('idle', '2026-11', 'usd', '2026-11-01Z', '2026-12-01Z', '2026-12-01T01:00Z', now())`)
		require.NoError(t, err)
		require.Nil(t, preflight("idle").Lookup, "a period without events makes no call")
	})
}

// A look-up made before the claim (Preflight.Lookup) that found nothing
// stands for the charge's only when it listed the charge's PaymentIntents
// and nothing since can have called Stripe without the claim seeing it.
func TestChargeClaimLookedUp(t *testing.T) {
	t.Parallel()
	ctx, b, _ := guardBundle(t, ledger.Config{})
	claimWith := func(c *ledger.Charge, lookedUp ledger.LookupTarget) *ledger.Claim {
		t.Helper()
		claim, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute,
			JobID: 1, JobAttempt: 1, LookedUp: &lookedUp})
		require.NoError(t, err)
		return claim
	}

	t.Run("TheChargesLookupMarksTheKeysFirstUse", func(t *testing.T) {
		c := closedWith(t, ctx, b, "acme", 1000)
		claim := claimWith(c, c.LookupTarget())
		require.False(t, claim.Lookup)
		require.NotZero(t, claim.AttemptID, "the attempt row of the coming call")
		require.Equal(t, claim.Charge.FirstAttemptedAt, claim.Charge.GenerationFirstAttemptedAt)
		require.Equal(t, 0, claim.Charge.KeyGeneration)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.charge_attempts WHERE charge_id = $1`, c.ID))
	})

	t.Run("AnotherListingIsNot", func(t *testing.T) {
		for i, change := range []func(*ledger.LookupTarget){
			func(t *ledger.LookupTarget) { t.StripeCustomerID = "cus_other" },
			func(t *ledger.LookupTarget) { t.ChargeKey = ledger.ChargeKey("", "other", "2026-11") },
			func(t *ledger.LookupTarget) { t.Namespace = "eu" },
			func(t *ledger.LookupTarget) { t.PeriodStartsAt = t.PeriodStartsAt.Add(time.Hour) },
		} {
			c := closedWith(t, ctx, b, fmt.Sprintf("other-%d", i), 1000)
			target := c.LookupTarget()
			change(&target)
			claim := claimWith(c, target)
			require.True(t, claim.Lookup, "case %d", i)
			require.Nil(t, claim.Charge.GenerationFirstAttemptedAt, "case %d", i)
			require.Zero(t, claim.AttemptID, "case %d", i)
		}
	})

	t.Run("NotAfterAnAttemptOrAMark", func(t *testing.T) {
		// Attempted, then its lease expired: an attempt of the generation
		// is on record, so no look-up is needed at all.
		c := closedWith(t, ctx, b, "again", 1000)
		first := claimWith(c, c.LookupTarget())
		_, err := b.Pool.Exec(ctx, `UPDATE billing.charges SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, c.ID)
		require.NoError(t, err)
		again := claimWith(c, c.LookupTarget())
		require.False(t, again.Lookup)
		require.Equal(t, first.Charge.GenerationFirstAttemptedAt, again.Charge.GenerationFirstAttemptedAt, "the first use stays")

		// After billingctl recover marked it, only a look-up after the
		// claim counts.
		marked := closedWith(t, ctx, b, "marked", 1000)
		_, err = b.Ledger.ChargeLookupMark(ctx, "operator:test", "restored")
		require.NoError(t, err)
		claim := claimWith(marked, marked.LookupTarget())
		require.True(t, claim.Lookup)
		require.Nil(t, claim.Charge.GenerationFirstAttemptedAt)
	})
}
