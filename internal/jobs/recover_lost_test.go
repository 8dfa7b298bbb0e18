package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// TestRecoverLostCharges is a lossy failover that dropped periods' closes
// and their charges after Stripe charged them: the promoted ledger has the
// periods open (or not at all) and no charge. billingctl recover finds
// this namespace's PaymentIntents on Stripe and gives each lost charge back:
// adopted when the restored sum is what was charged, held
// payment_intent_mismatch when it differs; never a new call.
func TestRecoverLostCharges(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	require.NoError(t, b.worker.Stop(ctx))
	b.customerWithEvents(t, ctx, "kept", 700, 300) // every event survives
	b.customerWithEvents(t, ctx, "short", 700)     // one more event after the loss point
	b.Customer(t, "eventless")                     // every event after the loss point
	dump := testdb.Dump(t, b.URL)                  // the loss point
	b.customerWithEvents(t, ctx, "newcomer", 900)  // created after the loss point
	_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "short", EventID: "late", AmountCents: 50})
	require.NoError(t, err)
	_, err = b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "eventless", EventID: "only", AmountCents: 800})
	require.NoError(t, err)

	b.startWorker(t, ctx)
	paid := map[string]string{}
	for _, id := range []string{"kept", "short", "eventless", "newcomer"} {
		b.closeNow(t, ctx, id)
		paid[id] = *b.waitCharge(t, ctx, id, statusIs(ledger.ChargeSucceeded)).StripePaymentIntentID
	}
	b.waitJobsFinalized(t)
	created := b.sim.Stats().PaymentIntentsCreated

	r := b.restored(t, dump)
	_, err = r.Ledger.ChargeGetByPeriod(ctx, "kept", "2026-11")
	require.ErrorIs(t, err, ledger.ErrNotFound, "the promoted ledger lost every charge")

	dry, err := jobs.Recover(ctx, r.Ledger, b.stripe, jobs.RecoverParams{DryRun: true})
	require.NoError(t, err)
	require.Len(t, dry, 4)
	for _, it := range dry {
		require.True(t, it.Lost)
		require.Equal(t, "would adopt", it.Action)
	}
	_, err = r.Ledger.ChargeGetByPeriod(ctx, "kept", "2026-11")
	require.ErrorIs(t, err, ledger.ErrNotFound, "a dry run changes nothing")

	items, err := jobs.Recover(ctx, r.Ledger, b.stripe, jobs.RecoverParams{Actor: "cli:test", Reason: "lossy failover"})
	require.NoError(t, err)
	lost := map[string]jobs.RecoverItem{}
	for _, it := range items {
		if it.Lost {
			lost[it.Charge.CustomerID] = it
		}
	}
	require.Len(t, lost, 4)

	c, err := r.Ledger.ChargeGetByPeriod(ctx, "kept", "2026-11")
	require.NoError(t, err)
	require.Equal(t, ledger.ChargeSucceeded, c.Status)
	require.Equal(t, paid["kept"], *c.StripePaymentIntentID)
	require.Equal(t, int64(1000), c.AmountCents)
	require.Equal(t, "adopted", lost["kept"].Action)
	p, err := r.Ledger.PeriodGet(ctx, "kept", "2026-11")
	require.NoError(t, err)
	require.Equal(t, ledger.PeriodClosed, p.Status, "its period is closed now, not at its natural close")

	for _, id := range []string{"short", "eventless"} {
		c, err := r.Ledger.ChargeGetByPeriod(ctx, id, "2026-11")
		require.NoError(t, err, id)
		require.Equal(t, ledger.ChargeHeld, c.Status, id)
		require.Equal(t, ledger.HeldPaymentIntentMismatch, *c.HeldReason, id)
		require.Contains(t, *c.HeldDetail, paid[id])
	}

	require.Error(t, lost["newcomer"].Err, "a customer the ledger lost too")
	require.Contains(t, lost["newcomer"].Err.Error(), "PUT /v1/customers/newcomer")

	// Again: nothing is lost any more but the newcomer.
	items, err = jobs.Recover(ctx, r.Ledger, b.stripe, jobs.RecoverParams{Actor: "cli:test", Reason: "again"})
	require.NoError(t, err)
	n := 0
	for _, it := range items {
		if it.Lost {
			n++
			require.Equal(t, "newcomer", it.Charge.CustomerID)
		}
	}
	require.Equal(t, 1, n)
	require.Equal(t, created, b.sim.Stats().PaymentIntentsCreated, "never a new PaymentIntent")
}
