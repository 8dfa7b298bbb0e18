package jobs_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
)

// grant gives customer id amount usd of credits.
func (b *testBundle) grant(t *testing.T, ctx context.Context, id string, amount int64) {
	t.Helper()
	_, created, err := b.Ledger.CreditGrantCreate(ctx, ledger.CreditGrantParams{CustomerID: id, GrantID: "g-" + id,
		AmountCents: amount, Currency: "usd", Category: ledger.CreditPaid, Actor: "operator:test"})
	require.NoError(t, err)
	require.True(t, created)
}

// runChargeJobNow makes the period's scheduled charge job run now: the job
// closes the period itself, in the transaction of its claim.
func (b *testBundle) runChargeJobNow(t *testing.T, ctx context.Context, customerID string) {
	t.Helper()
	p, err := b.Ledger.PeriodGet(ctx, customerID, "2026-11")
	require.NoError(t, err)
	require.NotNil(t, p.ChargeJobID)
	_, err = b.worker.JobRetry(ctx, *p.ChargeJobID)
	require.NoError(t, err)
}

// Credits are applied by the close in the charge job's close-and-claim
// transaction; the card is charged the rest, once.
func TestChargeWithCredits(t *testing.T) {
	t.Parallel()

	t.Run("CrashAfterTheBurnDownCommits", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{crashAt: jobs.CrashAfterClaim})
		b.customerWithEvents(t, ctx, "acme", 100, 250)
		b.grant(t, ctx, "acme", 200)
		b.runChargeJobNow(t, ctx, "acme")
		b.waitCrashed(t)
		c := b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.LeaseOwner != nil })
		require.Equal(t, int64(150), c.AmountCents, "the close applied the credits and committed with the claim")
		require.Empty(t, b.paymentIntents("cus_acme"))
		b.expireLeases()

		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		b.waitJobsFinalized(t)
		pis := b.sim.PaymentIntentList()
		require.Len(t, pis, 1)
		require.Equal(t, int64(150), pis[0].Amount, "Stripe charged what the credits left")
		require.Equal(t, int64(150), c.AmountCents)
		require.Equal(t, int64(-200), b.Count(t, `SELECT sum(amount_cents) FROM billing.credit_grant_entries WHERE kind = 'applied'`),
			"applied once across the dead run and its retry")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.credit_grant_entries WHERE kind = 'applied'`))
	})

	t.Run("CoveredWholeCallsNoStripe", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 100, 250)
		b.grant(t, ctx, "acme", 1000)
		b.runChargeJobNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeCovered))
		b.waitJobsFinalized(t)
		require.Zero(t, c.AmountCents)
		require.Empty(t, b.sim.PaymentIntentList())
		require.Zero(t, b.sim.Stats().Requests["POST /v1/payment_intents"]["ok"])
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.charge_attempts`))
		require.Equal(t, int64(650), b.Count(t, `SELECT sum(amount_cents) FROM billing.credit_grant_entries`))
	})
}
