package jobs_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// restored returns a bundle on a database restored from dump, sharing b's
// clock and simulator: Tally after an operator restored last night's backup.
func (b *testBundle) restored(t *testing.T, dump string) *testBundle {
	t.Helper()
	return b.restoredWith(t, dump, ledger.Config{})
}

// restoredWith is restored with the ledger settings of config (its clock,
// scheduler and logger are b's).
func (b *testBundle) restoredWith(t *testing.T, dump string, config ledger.Config) *testBundle {
	t.Helper()
	pool, url := testdb.Restore(t, dump)
	client, err := jobs.NewInsertClient(pool, b.Logger)
	require.NoError(t, err)
	config.Clock, config.Scheduler, config.Logger = b.Clock.Now, jobs.Scheduler{Client: client}, b.Logger
	l, err := ledger.New(pool, config)
	require.NoError(t, err)
	return &testBundle{
		Bundle: &ledgertest.Bundle{Ledger: l, Pool: pool, URL: url, Clock: b.Clock, River: client, Logger: b.Logger},
		sim:    b.sim, stripe: b.stripe, stripeTimeout: b.stripeTimeout, crash: &crashOnce{},
	}
}

// TestRestoreDrill is the operator's worst day: a backup is taken, every
// customer is charged, the backup is restored (every charge made since looks
// never attempted) and a day later, when Stripe has forgotten every key, the
// workers run again. They must find each charge's PaymentIntent on Stripe and
// adopt it: zero new PaymentIntents.
func TestRestoreDrill(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	require.NoError(t, b.worker.Stop(ctx)) // nothing is charged before the backup

	type customer struct {
		id     string
		total  int64
		status ledger.ChargeStatus // after the first charge run
	}
	var customers []customer
	for i := range 12 {
		c := customer{id: fmt.Sprintf("c%02d", i), status: ledger.ChargeSucceeded}
		c.total = b.customerWithEvents(t, ctx, c.id, int64(100+i), 250)
		switch i % 4 {
		case 1: // closed before the backup, its charge pending and never attempted
			_, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: c.id, Period: "2026-11", Actor: "operator:test"})
			require.NoError(t, err)
		case 2: // Stripe creates the PaymentIntent and answers 500: unknown
			b.fault(t, stripesim.Fault{Customer: "cus_" + c.id, Kind: stripesim.FaultKindError500AfterCreate, Count: 1})
			c.status = ledger.ChargeUnknown
		case 3:
			b.fault(t, stripesim.Fault{Customer: "cus_" + c.id, Kind: stripesim.FaultKindDecline, DeclineCode: "insufficient_funds"})
			c.status = ledger.ChargeFailed
		}
		customers = append(customers, c)
	}
	dump := testdb.Dump(t, b.URL)

	// Every charge job runs (their periods' close time has passed).
	worker := b.startWorker(t, ctx)
	for _, c := range customers {
		b.waitCharge(t, ctx, c.id, statusIs(c.status))
	}
	require.NoError(t, worker.Stop(ctx))
	before := map[string]*stripe.PaymentIntent{}
	for _, pi := range b.sim.PaymentIntentList() {
		require.Nil(t, before[pi.Metadata["customer_id"]], "one PaymentIntent per customer before the restore")
		before[pi.Metadata["customer_id"]] = pi
	}
	require.Len(t, before, len(customers))

	// Restore, a day passes (Stripe forgets every key), the workers run.
	r := b.restored(t, dump)
	require.Zero(t, r.Count(t, `SELECT count(*) FROM billing.charges WHERE first_attempted_at IS NOT NULL`), "the restored ledger has never called Stripe")
	b.pastKeyWindow()
	r.startWorker(t, ctx)
	for _, c := range customers {
		want := c.status
		if want == ledger.ChargeUnknown {
			want = ledger.ChargeSucceeded // the 500 hid a success
		}
		got := r.waitCharge(t, ctx, c.id, statusIs(want))
		require.Equal(t, c.total, got.AmountCents)
		require.Equal(t, before[c.id].ID, *got.StripePaymentIntentID, "%s adopted its PaymentIntent", c.id)
		require.Empty(t, r.attempts(t, ctx, got.ID), "%s: no call was made", c.id)
	}
	r.waitJobsFinalized(t)
	require.Len(t, b.sim.PaymentIntentList(), len(customers))
	require.Equal(t, len(customers), b.sim.Stats().PaymentIntentsCreated, "zero new PaymentIntents")
}
