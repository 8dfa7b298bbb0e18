package jobs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// pastKeyWindow moves the shared clock (ledger and simulator) a day on:
// past Tally's 23 h key window and Stripe's 24 h key retention.
func (b *testBundle) pastKeyWindow() { b.Clock.Advance(24*time.Hour + time.Minute) }

// pastTallyKeyWindow moves the shared clock just past Tally's key window,
// where Stripe still remembers the keys, as in production (the window's
// hour of margin): a call of the old key already in flight when the clock
// jumps gets Stripe's stored answer, as it would, instead of a key Stripe
// forgot at the same instant.
func (b *testBundle) pastTallyKeyWindow() {
	b.Clock.Advance(ledger.StripeKeyWindowDefault + time.Minute)
}

func TestKeyWindowReconciliation(t *testing.T) {
	t.Parallel()

	t.Run("CrashAfterNewKeyBeforeStripe", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 300)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500BeforeCreate, Count: 1})
		b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.Status == ledger.ChargeUnknown && c.AttemptCount >= 2 })
		b.crash.arm(jobs.CrashAfterLookup)
		b.pastTallyKeyWindow()
		// The run dies with the next generation committed and its lease held.
		b.waitCrashed(t)
		c := b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.KeyGeneration == 1 })
		require.Equal(t, ledger.ChargePending, c.Status)
		require.Empty(t, b.paymentIntents("cus_acme"))
		b.expireLeases()

		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, 1, c.KeyGeneration, "the retry uses the committed generation's key, within its fresh window")
		require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID})
	})

	t.Run("Error500AfterCreateFoundAfterWindow", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 300)
		// Every call within the window replays the stored 500.
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500AfterCreate, Count: 1})
		b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.Status == ledger.ChargeUnknown && c.AttemptCount >= 2 })
		b.pastTallyKeyWindow()

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, "reconcile", *c.ResolvedBy)
		require.Equal(t, 0, c.KeyGeneration)
		require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID}, "exactly one PaymentIntent")
		b.waitJobsFinalized(t)
	})

	t.Run("Error500BeforeCreateNextGeneration", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 300)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500BeforeCreate, Count: 1})
		b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.Status == ledger.ChargeUnknown && c.AttemptCount >= 2 })
		require.Empty(t, b.paymentIntents("cus_acme"))
		b.pastTallyKeyWindow()

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, 1, c.KeyGeneration)
		require.Equal(t, ledger.ChargeIdempotencyKey("default", "acme", "2026-11", 1), c.IdempotencyKey)
		pis := b.sim.PaymentIntentList()
		require.Len(t, pis, 1, "the next generation's key created exactly one PaymentIntent")
		require.Equal(t, ledger.ChargeKey("default", "acme", "2026-11"), pis[0].Metadata["tally_charge_key"])
	})

	t.Run("RedriveOfDiscardedJobAfterWindow", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 300)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500AfterCreate, Count: 1})
		charge := b.closeNow(t, ctx, "acme")
		// Make the job give up quickly, as 25 attempts over days would.
		_, err := b.Pool.Exec(ctx, `UPDATE river.river_job SET max_attempts = 3 WHERE kind = 'charge_period'`)
		require.NoError(t, err)
		deadline := time.Now().Add(waitTimeout)
		for b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_period' AND state = 'discarded'`) == 0 {
			require.True(t, time.Now().Before(deadline), "the job was never discarded")
			time.Sleep(50 * time.Millisecond)
		}
		c, err := b.Ledger.ChargeGet(ctx, charge.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeUnknown, c.Status)

		// Days later, an operator redrives everything discarded, twice.
		b.pastTallyKeyWindow()
		b.Clock.Advance(48 * time.Hour)
		items, err := jobs.Redrive(ctx, b.River, jobs.RedriveParams{CustomerID: "acme"})
		require.NoError(t, err)
		require.Len(t, items, 1)
		require.Contains(t, items[0].Error, "outcome unknown")
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		b.waitJobsFinalized(t)
		items, err = jobs.Redrive(ctx, b.River, jobs.RedriveParams{})
		require.NoError(t, err)
		require.Empty(t, items)
		require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID}, "no second PaymentIntent")
	})

	t.Run("TwoMatchesAreHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 300)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500BeforeCreate, Count: 1})
		charge := b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.Status == ledger.ChargeUnknown })
		// Two PaymentIntents carrying the charge's key (say, a bug elsewhere).
		for i := range 2 {
			params := &stripe.PaymentIntentParams{Amount: stripe.Int64(300), Currency: stripe.String("usd"),
				Customer: stripe.String("cus_acme"), Confirm: stripe.Bool(true), PaymentMethod: stripe.String("pm_card_visa")}
			params.AddMetadata("tally_charge_key", charge.ChargeKey)
			params.AddMetadata("tally_namespace", charge.KeyNamespace)
			params.SetIdempotencyKey(fmt.Sprintf("elsewhere-%d", i))
			_, err := b.stripe.PaymentIntentCreate(ctx, params)
			require.NoError(t, err)
		}
		b.pastTallyKeyWindow()

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))
		require.Equal(t, ledger.HeldDoubleCharge, *c.HeldReason)
		require.Contains(t, *c.HeldDetail, "double charge")
		b.waitJobsFinalized(t)
		require.Len(t, b.sim.PaymentIntentList(), 2, "nothing more was charged")
	})
}

func TestReconcileCharge(t *testing.T) {
	t.Parallel()

	t.Run("ListsEveryPage", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 300)
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		// 250 other PaymentIntents of the same customer, created after ours.
		for i := range 250 {
			params := &stripe.PaymentIntentParams{Amount: stripe.Int64(50), Currency: stripe.String("usd"),
				Customer: stripe.String("cus_acme"), Confirm: stripe.Bool(true), PaymentMethod: stripe.String("pm_card_visa")}
			params.SetIdempotencyKey(fmt.Sprintf("other-%d", i))
			_, err := b.stripe.PaymentIntentCreate(ctx, params)
			require.NoError(t, err)
		}
		all, err := b.stripe.PaymentIntentList(ctx, "cus_acme", ledgertest.ClockStart.Add(-time.Hour))
		require.NoError(t, err)
		require.Len(t, all, 251)
		ids := map[string]bool{}
		for _, pi := range all {
			ids[pi.ID] = true
		}
		require.Len(t, ids, 251, "no PaymentIntent listed twice")
		require.True(t, ids[*c.StripePaymentIntentID])
	})

	t.Run("RequeuesWhenStripeHasNothing", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 300)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500BeforeCreate, Count: 1})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeUnknown))
		require.NoError(t, b.worker.Stop(ctx))

		res, err := jobs.ReconcileCharge(ctx, b.Ledger, b.stripe, c)
		require.NoError(t, err)
		require.Equal(t, "requeued", res.Action)
		require.Empty(t, res.PaymentIntents)
		require.Equal(t, ledger.ChargeUnknown, res.Charge.Status)
	})

	t.Run("ResolvesUnknownFromStripe", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 300)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500AfterCreate, Count: 1})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeUnknown))
		require.NoError(t, b.worker.Stop(ctx)) // the reconciler alone, as for a job discarded long ago

		res, err := jobs.ReconcileCharge(ctx, b.Ledger, b.stripe, c)
		require.NoError(t, err)
		require.Equal(t, "resolved", res.Action)
		require.Equal(t, ledger.ChargeSucceeded, res.Charge.Status)
		require.Len(t, res.PaymentIntents, 1)
		require.Equal(t, b.paymentIntents("cus_acme"), []string{res.PaymentIntents[0].ID})

		res, err = jobs.ReconcileCharge(ctx, b.Ledger, b.stripe, res.Charge)
		require.NoError(t, err)
		require.Equal(t, "skipped", res.Action, "settled charges are left alone")
	})
}

func TestChargeJobRunNowAfterRiverDeletedTheJob(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	b.customerWithEvents(t, ctx, "acme", 300)
	b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500BeforeCreate, Count: 1})
	charge := b.closeNow(t, ctx, "acme")
	b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeUnknown))
	require.NoError(t, b.worker.Stop(ctx))
	// A week later River's retention has deleted the discarded job.
	_, err := b.Pool.Exec(ctx, `DELETE FROM river.river_job WHERE kind = 'charge_period'`)
	require.NoError(t, err)
	b.pastKeyWindow()

	require.NoError(t, b.Ledger.ChargeJobRunNow(ctx, charge.ID))
	p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
	require.NoError(t, err)
	require.Equal(t, *p.ChargeJobID, b.Count(t, `SELECT id FROM river.river_job WHERE kind = 'charge_period'`), "a new job, recorded on the period")

	b.startWorker(t, ctx)
	c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	require.Equal(t, 1, c.KeyGeneration)
	require.Len(t, b.paymentIntents("cus_acme"), 1)
}
