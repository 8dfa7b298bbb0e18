package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/testdb"
	"github.com/tally-billing/tally/internal/webhook"
)

// dunningSchedule is the tests' schedule: retries 1 h and 2 h after the first
// decline, on the ledger's fake clock.
var dunningSchedule = []time.Duration{time.Hour, 2 * time.Hour}

// piStatuses returns the status of each PaymentIntent of a Stripe customer,
// by id, and how many succeeded.
func (b *testBundle) piStatuses(stripeCustomer string) (map[string]stripe.PaymentIntentStatus, int) {
	statuses := map[string]stripe.PaymentIntentStatus{}
	succeeded := 0
	for _, pi := range b.sim.PaymentIntentList() {
		if pi.Customer != nil && pi.Customer.ID == stripeCustomer {
			statuses[pi.ID] = pi.Status
			if pi.Status == stripe.PaymentIntentStatusSucceeded {
				succeeded++
			}
		}
	}
	return statuses, succeeded
}

// retryDue moves the ledger's clock by d and starts the retries then due, as
// the dunning scan does.
func (b *testBundle) retryDue(t *testing.T, ctx context.Context, d time.Duration) []int64 {
	t.Helper()
	b.Clock.Advance(d)
	ids, err := b.Ledger.ChargeRetriesDue(ctx, 100)
	require.NoError(t, err)
	return ids
}

// declined gives acme a charge of 500 whose calls Stripe answers with fault
// (for cus_acme), closes it and waits until it is past_due.
func (b *testBundle) declined(t *testing.T, ctx context.Context, fault stripesim.Fault) *ledger.Charge {
	t.Helper()
	b.customerWithEvents(t, ctx, "acme", 500)
	fault.Customer = "cus_acme"
	b.fault(t, fault)
	b.closeNow(t, ctx, "acme")
	return b.waitCharge(t, ctx, "acme", pastDue(0))
}

// pastDue waits for the charge of customerID to be past_due after its
// retries-th retry.
func pastDue(retries int) func(c *ledger.Charge) bool {
	return func(c *ledger.Charge) bool { return c.Status == ledger.ChargePastDue && c.DunningRetries == retries }
}

func TestDunning(t *testing.T) {
	t.Parallel()
	opts := setupOpts{ledger: ledger.Config{DunningSchedule: dunningSchedule, WebhooksAllow: webhook.LoopbackNetworks()}}

	t.Run("DeclinedOnceThenPaid", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		b.customerWithEvents(t, ctx, "acme", 500)
		hook := b.endpoint(t, ctx, 0, ledger.NotifyChargePastDue, ledger.NotifyChargeSucceeded)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindDecline, DeclineCode: "insufficient_funds", Count: 1})
		start := b.Clock.Now()
		b.closeNow(t, ctx, "acme")

		c := b.waitCharge(t, ctx, "acme", pastDue(0))
		first := *c.StripePaymentIntentID
		require.Equal(t, "card_declined", *c.FailureCode)
		require.WithinDuration(t, start.Add(time.Hour), *c.NextRetryAt, time.Minute, "the first retry is an hour after the decline")
		require.True(t, c.BudgetReserved, "a past_due charge keeps its reservation")

		require.Empty(t, b.retryDue(t, ctx, 30*time.Minute), "not due yet")
		require.Equal(t, []int64{c.ID}, b.retryDue(t, ctx, 31*time.Minute))
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, 1, c.KeyGeneration, "the retry used the next key generation")
		require.Equal(t, []string{first}, c.RetiredPaymentIntentIDs)
		require.NotEqual(t, first, *c.StripePaymentIntentID)
		require.Nil(t, c.NextRetryAt)
		statuses, succeeded := b.piStatuses("cus_acme")
		require.Equal(t, map[string]stripe.PaymentIntentStatus{
			first: stripe.PaymentIntentStatusCanceled, *c.StripePaymentIntentID: stripe.PaymentIntentStatusSucceeded,
		}, statuses, "the declined PaymentIntent was canceled before the new one was made")
		require.Equal(t, 1, succeeded)
		require.Equal(t, []string{"failed", "succeeded"}, b.attempts(t, ctx, c.ID))

		require.Eventually(t, func() bool { return len(hook.delivered()) == 2 }, waitTimeout, 20*time.Millisecond)
		types := []string{hook.delivered()[0].Type, hook.delivered()[1].Type}
		require.ElementsMatch(t, []string{ledger.NotifyChargePastDue, ledger.NotifyChargeSucceeded}, types)
	})

	t.Run("DeclinedToTheEndIsUncollectible", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		b.customerWithEvents(t, ctx, "acme", 500)
		hook := b.endpoint(t, ctx, 0, ledger.NotifyChargeUncollectible)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindDecline, DeclineCode: "expired_card"})
		start := b.Clock.Now()
		b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", pastDue(0))

		b.retryDue(t, ctx, time.Hour)
		c := b.waitCharge(t, ctx, "acme", pastDue(1))
		require.WithinDuration(t, start.Add(2*time.Hour), *c.NextRetryAt, time.Minute, "offsets count from the first decline")
		b.retryDue(t, ctx, time.Hour)
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeUncollectible))
		require.Equal(t, 2, c.DunningRetries)
		require.False(t, c.BudgetReserved, "an uncollectible charge releases its reservation")
		require.Len(t, c.RetiredPaymentIntentIDs, 2)
		statuses, succeeded := b.piStatuses("cus_acme")
		require.Len(t, statuses, 3, "one PaymentIntent per try")
		require.Zero(t, succeeded)
		require.Equal(t, []string{"failed", "failed", "failed"}, b.attempts(t, ctx, c.ID))
		require.Eventually(t, func() bool { return len(hook.delivered()) == 1 }, waitTimeout, 20*time.Millisecond)
		require.Equal(t, ledger.NotifyChargeUncollectible, hook.delivered()[0].Type)

		require.Empty(t, b.retryDue(t, ctx, 24*time.Hour), "uncollectible is terminal")
	})

	t.Run("PaidBeforeItsRetry", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindRequiresAction, Count: 1})
		// The customer authenticates the declined PaymentIntent; no webhook
		// reaches Tally (none configured here).
		_, err := b.sim.PaymentIntentSettle(*c.StripePaymentIntentID, stripesim.PaymentIntentSettleParams{Status: stripesim.SettleStatusSucceeded})
		require.NoError(t, err)

		b.retryDue(t, ctx, time.Hour)
		settled := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, *c.StripePaymentIntentID, *settled.StripePaymentIntentID, "the retry found it paid and made no new PaymentIntent")
		statuses, succeeded := b.piStatuses("cus_acme")
		require.Len(t, statuses, 1)
		require.Equal(t, 1, succeeded)
	})

	t.Run("RetryNow", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindDecline, Count: 1})
		// The producer's customer registers a new card, then asks for a retry.
		_, err := b.Pool.Exec(ctx, `UPDATE billing.customers SET stripe_payment_method_id = 'pm_card_new' WHERE customer_id = 'acme'`)
		require.NoError(t, err)
		_, err = b.Ledger.ChargeRetryNow(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:test"})
		require.NoError(t, err)
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, "pm_card_new", *c.StripePaymentMethodID, "the retry reads the customer's current payment method")
		require.Equal(t, 1, c.DunningRetries)
		actions, err := b.Ledger.ChargeActions(ctx, c.ID)
		require.NoError(t, err)
		require.Len(t, actions, 1)
		require.Equal(t, ledger.ActionRetry, actions[0].Action)
		require.Equal(t, ledger.ChargeRetryReasonDefault, actions[0].Reason)

		_, err = b.Ledger.ChargeRetryNow(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:test"})
		var conflict *ledger.ConflictError
		require.ErrorAs(t, err, &conflict)
		require.Equal(t, ledger.ConflictChargeNotPastDue, conflict.Code)
	})

	t.Run("KillSwitchHoldsTheRetry", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindDecline, Count: 1})
		_, err := b.Ledger.ChargingPause(ctx, "operator:test", "incident")
		require.NoError(t, err)
		b.retryDue(t, ctx, time.Hour)
		// The kill switch pauses the charges queue: the retry's job waits
		// there, and a run already going stops at its claim.
		time.Sleep(time.Second)
		statuses, _ := b.piStatuses("cus_acme")
		require.Len(t, statuses, 1, "nothing was canceled nor created while paused")
		got, err := b.Ledger.ChargeGet(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePastDue, got.Status)

		_, err = b.Ledger.ChargingResume(ctx, "operator:test", "incident over")
		require.NoError(t, err)
		b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	})

	t.Run("ScanStartsDueRetries", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{ledger: opts.ledger, dunningInterval: 200 * time.Millisecond})
		b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindDecline, Count: 1})
		b.Clock.Advance(time.Hour)
		b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	})
}

// TestDunningCrash crashes a retry at each of its points and checks that the
// next run finishes it with one succeeded PaymentIntent.
func TestDunningCrash(t *testing.T) {
	t.Parallel()
	for _, point := range []string{jobs.CrashAfterClaim, jobs.CrashAfterCancel, jobs.CrashAfterRetryBegin, jobs.CrashAfterStripe, jobs.CrashBeforeComplete} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			ctx, b := setup(t, setupOpts{ledger: ledger.Config{DunningSchedule: dunningSchedule}})
			c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindDecline, Count: 1})
			first := *c.StripePaymentIntentID

			b.crash.arm(point)
			b.retryDue(t, ctx, time.Hour)
			b.waitCrashed(t)
			if point == jobs.CrashAfterRetryBegin {
				// News of the canceled PaymentIntent (a late webhook) reaches
				// the charge between its retry's commit and its call: it must
				// not move the charge, which names no PaymentIntent yet.
				got, err := b.Ledger.ChargeGet(ctx, c.ID)
				require.NoError(t, err)
				require.Equal(t, ledger.ChargePending, got.Status)
				applied, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "webhook:evt_late",
					Outcome: ledger.Outcome{Class: ledger.OutcomeFailed, StripePaymentIntentID: first, ErrorCode: "card_declined"}})
				require.NoError(t, err)
				require.Equal(t, ledger.ChargePending, applied.Charge.Status, "news of a retired PaymentIntent moves nothing")
			}
			b.expireLeases()
			require.NoError(t, b.Ledger.ChargeJobRunNow(ctx, c.ID))

			c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
			statuses, succeeded := b.piStatuses("cus_acme")
			require.Equal(t, 1, succeeded, "one succeeded PaymentIntent: %v", statuses)
			require.Len(t, statuses, 2)
			require.Equal(t, stripe.PaymentIntentStatusCanceled, statuses[first])
			require.Equal(t, 1, c.KeyGeneration)
		})
	}
}

// TestDunningLateProcessingEvent delivers a payment_intent.processing event
// of a past_due charge's declined PaymentIntent after the decline (Stripe
// made it before; deliveries are not ordered): the charge stays past_due
// with its retry, which then succeeds with one PaymentIntent.
func TestDunningLateProcessingEvent(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{ledger: ledger.Config{DunningSchedule: dunningSchedule}})
	c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindDecline, Count: 1})

	applied, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeKey: c.ChargeKey, Actor: "webhook:evt_late_processing",
		Outcome: ledger.Outcome{Class: ledger.OutcomeProcessing, StripePaymentIntentID: *c.StripePaymentIntentID, ResolvedBy: "webhook:evt_late_processing"}})
	require.NoError(t, err)
	require.False(t, applied.Changed)
	got, err := b.Ledger.ChargeGet(ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.ChargePastDue, got.Status, "a late processing event moves nothing")
	require.Equal(t, c.NextRetryAt, got.NextRetryAt, "the retry stays scheduled")

	require.Equal(t, []int64{c.ID}, b.retryDue(t, ctx, time.Hour))
	got = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	require.Equal(t, 1, got.KeyGeneration, "paid by its retry")
	_, succeeded := b.piStatuses("cus_acme")
	require.Equal(t, 1, succeeded)
}

// TestDunningRestoredBeforeARetry restores a backup taken while a charge was
// past_due, after its retry succeeded on Stripe (the first PaymentIntent
// canceled, the retry's succeeded): when the restored charge's retry comes
// due it finds both, and takes the retry's PaymentIntent, one succeeded and
// no new call. A canceled PaymentIntent is not a charge: no double_charge.
func TestDunningRestoredBeforeARetry(t *testing.T) {
	t.Parallel()
	config := ledger.Config{DunningSchedule: dunningSchedule}
	ctx, b := setup(t, setupOpts{ledger: config})
	c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindDecline, Count: 1})
	first := *c.StripePaymentIntentID
	dump := testdb.Dump(t, b.URL)

	b.retryDue(t, ctx, time.Hour)
	paid := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	require.NoError(t, b.worker.Stop(ctx))

	r := b.restoredWith(t, dump, config)
	got, err := r.Ledger.ChargeGet(ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.ChargePastDue, got.Status, "the restored ledger has not seen the retry")
	r.startWorker(t, ctx)
	require.Equal(t, []int64{c.ID}, r.retryDue(t, ctx, time.Minute))

	got = r.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.Status != ledger.ChargePastDue })
	require.Equal(t, ledger.ChargeSucceeded, got.Status, "%+v", got)
	require.Equal(t, *paid.StripePaymentIntentID, *got.StripePaymentIntentID)
	require.Equal(t, []string{first}, got.RetiredPaymentIntentIDs)
	statuses, succeeded := b.piStatuses("cus_acme")
	require.Len(t, statuses, 2, "no new PaymentIntent")
	require.Equal(t, 1, succeeded)
	r.waitJobsFinalized(t)
}

// TestDunningCancel cancels past_due charges as an operator writing off a
// debt: the charge job cancels every PaymentIntent of the charge that could
// still succeed first, then the charge, with who and why recorded; the kill
// switch holds the cancel like a retry; a PaymentIntent paid meanwhile
// settles the charge instead.
func TestDunningCancel(t *testing.T) {
	t.Parallel()
	opts := setupOpts{ledger: ledger.Config{DunningSchedule: dunningSchedule}}

	t.Run("CancelsItsPaymentIntentsThenTheCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindRequiresAction, Count: 1})
		first := *c.StripePaymentIntentID

		got, err := b.Ledger.ChargeCancel(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:oncall", Reason: "customer left; written off"})
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePastDue, got.Status, "carried out by its charge job")
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeCanceled))
		require.Equal(t, []string{first}, c.RetiredPaymentIntentIDs)
		require.False(t, c.BudgetReserved, "a canceled charge releases its reservation")
		statuses, succeeded := b.piStatuses("cus_acme")
		require.Equal(t, map[string]stripe.PaymentIntentStatus{first: stripe.PaymentIntentStatusCanceled}, statuses,
			"its PaymentIntent can never succeed now, and nothing new was made")
		require.Zero(t, succeeded)

		actions, err := b.Ledger.ChargeActions(ctx, c.ID)
		require.NoError(t, err)
		require.Len(t, actions, 2)
		for i, state := range []string{"requested", "done"} {
			require.Equal(t, ledger.ActionCancel, actions[i].Action)
			require.Equal(t, "operator:oncall", actions[i].Actor)
			require.Equal(t, "customer left; written off", actions[i].Reason)
			require.Equal(t, state, actions[i].Detail["state"])
		}
		require.Equal(t, ledger.ChargeCanceled, *actions[1].StatusAfter)
		require.Equal(t, int64(1), b.Count(t, `
SELECT count(*) FROM billing.charge_transitions
WHERE charge_id = $1 AND from_status = 'past_due' AND to_status = 'canceled' AND actor = 'operator:oncall'`, c.ID))
		b.waitJobsFinalized(t)

		// A late success of the canceled PaymentIntent moves nothing.
		applied, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "webhook:evt_late",
			Outcome: ledger.Outcome{Class: ledger.OutcomeFailed, StripePaymentIntentID: first, ErrorCode: "canceled"}})
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeCanceled, applied.Charge.Status)
	})

	t.Run("KillSwitchHoldsIt", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindDecline, Count: 1})
		_, err := b.Ledger.ChargingPause(ctx, "operator:test", "incident")
		require.NoError(t, err)
		_, err = b.Ledger.ChargeCancel(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:test", Reason: "written off"})
		require.NoError(t, err)
		time.Sleep(time.Second)
		got, err := b.Ledger.ChargeGet(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePastDue, got.Status)
		statuses, _ := b.piStatuses("cus_acme")
		require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, statuses[*c.StripePaymentIntentID], "nothing canceled while paused")

		_, err = b.Ledger.ChargingResume(ctx, "operator:test", "incident over")
		require.NoError(t, err)
		b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeCanceled))
	})

	t.Run("PaidMeanwhileSettles", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindRequiresAction, Count: 1})
		// The customer authenticates before the cancel is carried out.
		_, err := b.sim.PaymentIntentSettle(*c.StripePaymentIntentID, stripesim.PaymentIntentSettleParams{Status: stripesim.SettleStatusSucceeded})
		require.NoError(t, err)
		_, err = b.Ledger.ChargeCancel(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:test", Reason: "written off"})
		require.NoError(t, err)
		got := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, *c.StripePaymentIntentID, *got.StripePaymentIntentID)
		require.Nil(t, got.CancelRequestedAt, "the request lasts only while the charge is past_due")
	})

	t.Run("CrashAfterTheCancels", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		c := b.declined(t, ctx, stripesim.Fault{Kind: stripesim.FaultKindDecline, Count: 1})
		b.crash.arm(jobs.CrashAfterCancel)
		_, err := b.Ledger.ChargeCancel(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:test", Reason: "written off"})
		require.NoError(t, err)
		b.waitCrashed(t)
		b.expireLeases()
		require.NoError(t, b.Ledger.ChargeJobRunNow(ctx, c.ID))
		got := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeCanceled))
		require.Equal(t, []string{*c.StripePaymentIntentID}, got.RetiredPaymentIntentIDs)
	})
}
