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

// TestPeriodBudgetRace: three worker replicas race 50 charges of 100 cents
// against a budget of 2,000. Exactly 20 are charged and 30 held, never 21.
func TestPeriodBudgetRace(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{ledger: ledger.Config{PeriodBudgetCents: 2_000}})
	b.startWorker(t, ctx)
	b.startWorker(t, ctx)
	const n = 50
	for i := range n {
		b.customerWithEvents(t, ctx, fmt.Sprintf("c%02d", i), 60, 40)
	}
	for i := range n {
		_, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: fmt.Sprintf("c%02d", i), Period: "2026-11",
			Actor: "operator:test", RunChargeJobNow: true})
		require.NoError(t, err)
	}
	counts := map[ledger.ChargeStatus]int{}
	for i := range n {
		c := b.waitCharge(t, ctx, fmt.Sprintf("c%02d", i), func(c *ledger.Charge) bool {
			return c.Status == ledger.ChargeSucceeded || c.Status == ledger.ChargeHeld
		})
		counts[c.Status]++
		if c.Status == ledger.ChargeHeld {
			require.Equal(t, ledger.HeldOverPeriodBudget, *c.HeldReason)
		}
	}
	require.Equal(t, map[ledger.ChargeStatus]int{ledger.ChargeSucceeded: 20, ledger.ChargeHeld: 30}, counts)
	require.Len(t, b.sim.PaymentIntentList(), 20, "never a 21st")
	s, err := b.Ledger.PeriodSpendGet(ctx, "2026-11", "usd")
	require.NoError(t, err)
	require.Equal(t, int64(2_000), s.ReservedCents)
}

// TestKillSwitch: charging paused through one replica stops every replica
// before any PaymentIntent; resumed, every charge completes.
func TestKillSwitch(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	b.startWorker(t, ctx) // a second replica
	st, err := b.Ledger.ChargingPause(ctx, "operator:ops/tly_1", "incident 42")
	require.NoError(t, err)
	require.True(t, st.Paused)

	const n = 6
	for i := range n {
		b.customerWithEvents(t, ctx, fmt.Sprintf("c%d", i), 100)
		b.closeNow(t, ctx, fmt.Sprintf("c%d", i))
	}
	// Give both replicas time to fetch (they must not), bounded.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		require.Empty(t, b.sim.PaymentIntentList(), "no money moves while paused")
		time.Sleep(100 * time.Millisecond)
	}
	// No PaymentIntent call. A replica may still read from Stripe (a job's
	// pre-flight) when it fetched before River told it of the pause: the
	// pause reaches a client by notification or its next poll, and the
	// ledger's claim, which refuses while paused, is what holds the money.
	require.Empty(t, b.sim.Stats().Requests["POST /v1/payment_intents"], "no PaymentIntent call while paused")
	require.Equal(t, int64(n), b.Count(t, `SELECT count(*) FROM billing.charges WHERE status = 'pending' AND attempt_count = 0`))

	_, err = b.Ledger.ChargingResume(ctx, "operator:ops/tly_1", "incident over")
	require.NoError(t, err)
	for i := range n {
		b.waitCharge(t, ctx, fmt.Sprintf("c%d", i), statusIs(ledger.ChargeSucceeded))
	}
	require.Len(t, b.sim.PaymentIntentList(), n)
}

// TestChargeResolve: a double charge is resolved by keeping one
// PaymentIntent and refunding the other, once, however often it runs.
func TestChargeResolveDoubleCharge(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	total := b.customerWithEvents(t, ctx, "acme", 700)
	keep := b.lostCall(t, ctx, "acme", total)
	other := b.lostCall(t, ctx, "acme", total)
	b.closeNow(t, ctx, "acme")
	c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))
	require.Equal(t, ledger.HeldDoubleCharge, *c.HeldReason)

	for range 2 { // a resolve asked twice refunds once
		_, err := b.Ledger.ChargeResolveRequest(ctx, ledger.ChargeResolveRequestParams{
			ChargeActionParams: ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "customer called"},
			KeepPaymentIntent:  keep.ID,
		})
		if err != nil {
			var ce *ledger.ConflictError
			require.ErrorAs(t, err, &ce, "the second may come after the first settled")
		}
	}
	c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	require.Equal(t, keep.ID, *c.StripePaymentIntentID)
	require.Equal(t, "operator:ops/tly_1", *c.ResolvedBy)
	b.waitJobsFinalized(t)
	deadline := time.Now().Add(waitTimeout)
	for b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_resolve' AND finalized_at IS NULL`) > 0 {
		require.True(t, time.Now().Before(deadline))
		time.Sleep(50 * time.Millisecond)
	}
	refunds := b.sim.RefundList()
	require.Len(t, refunds, 1, "exactly one refund")
	require.Equal(t, other.ID, refunds[0].PaymentIntent.ID)
	require.Equal(t, stripe.RefundStatusSucceeded, refunds[0].Status)
	require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.refunds WHERE charge_id = $1 AND stripe_payment_intent_id = $2`, c.ID, other.ID))
	actions, err := b.Ledger.ChargeActions(ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.ActionResolve, actions[len(actions)-1].Action)
	require.Equal(t, ledger.ChargeSucceeded, *actions[len(actions)-1].StatusAfter)
}

// TestChargeApproveCharges: a charge held over its customer's cap is charged
// once an operator approves it.
func TestChargeApproveCharges(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	b.customerWithEvents(t, ctx, "acme", 700)
	limit := int64(500)
	_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd", MaxChargeCents: &limit})
	require.NoError(t, err)
	b.closeNow(t, ctx, "acme")
	c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))
	require.Equal(t, ledger.HeldOverCustomerCap, *c.HeldReason)
	b.waitJobsFinalized(t)
	require.Empty(t, b.sim.PaymentIntentList())

	_, err = b.Ledger.ChargeApprove(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "one-off migration month"})
	require.NoError(t, err)
	c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	require.Equal(t, int64(700), c.AmountCents)
	require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID})
}

// TestChargeApproveAfterIdempotencyError: Stripe keeps the charge's key with
// other parameters (a stored 500, then the parameters changed); the approved
// charge looks at Stripe, finds nothing, and charges once with its next key.
func TestChargeApproveAfterIdempotencyError(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	b.customerWithEvents(t, ctx, "acme", 700)
	b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500BeforeCreate, Count: 1})
	charge := b.closeNow(t, ctx, "acme")
	b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeUnknown))
	// A bug changes the parameters under the stored key.
	_, err := b.Pool.Exec(ctx, `UPDATE billing.charges SET amount_cents = amount_cents + 1 WHERE id = $1`, charge.ID)
	require.NoError(t, err)
	c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))
	require.Equal(t, ledger.HeldIdempotencyError, *c.HeldReason)
	require.Empty(t, b.sim.PaymentIntentList())

	_, err = b.Ledger.ChargeApprove(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "amount corrected"})
	require.NoError(t, err)
	c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	require.Equal(t, 1, c.KeyGeneration)
	require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID})
}

// TestChargeResolveSucceededCharge: a second PaymentIntent carrying the key
// turns up after the charge succeeded; resolve keeps the charge's own and
// refunds the other.
func TestChargeResolveSucceededCharge(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	total := b.customerWithEvents(t, ctx, "acme", 700)
	b.closeNow(t, ctx, "acme")
	c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	other := b.lostCall(t, ctx, "acme", total) // a bug elsewhere charged again

	_, err := b.Ledger.ChargeResolveRequest(ctx, ledger.ChargeResolveRequestParams{
		ChargeActionParams: ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "refund the duplicate"},
		KeepPaymentIntent:  other.ID,
	})
	var ce *ledger.ConflictError
	require.ErrorAs(t, err, &ce, "a settled charge keeps its own PaymentIntent")

	_, err = b.Ledger.ChargeResolveRequest(ctx, ledger.ChargeResolveRequestParams{
		ChargeActionParams: ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "refund the duplicate"},
		KeepPaymentIntent:  *c.StripePaymentIntentID,
	})
	require.NoError(t, err)
	deadline := time.Now().Add(waitTimeout)
	for len(b.sim.RefundList()) == 0 {
		require.True(t, time.Now().Before(deadline), "the duplicate was never refunded")
		time.Sleep(50 * time.Millisecond)
	}
	refunds := b.sim.RefundList()
	require.Len(t, refunds, 1)
	require.Equal(t, other.ID, refunds[0].PaymentIntent.ID)
	got, err := b.Ledger.ChargeGet(ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, ledger.ChargeSucceeded, got.Status)
	require.Equal(t, *c.StripePaymentIntentID, *got.StripePaymentIntentID)
}

// TestChargeBelowMinimum: a total below Stripe's minimum is never sent (Stripe
// would refuse it, and those events would never be billed): it is carried
// forward.
func TestChargeBelowMinimum(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	b.customerWithEvents(t, ctx, "acme", 20, 29)
	b.closeNow(t, ctx, "acme")
	c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeCarriedForward))
	require.Equal(t, int64(49), c.AmountCents)
	b.waitJobsFinalized(t)
	require.Empty(t, b.sim.PaymentIntentList())
	require.Zero(t, b.sim.Stats().Requests["POST /v1/payment_intents"]["invalid_request"], "never sent")

	// The simulator refuses it as Stripe does.
	params := &stripe.PaymentIntentParams{Amount: stripe.Int64(49), Currency: stripe.String("usd"),
		Customer: stripe.String("cus_acme"), PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true)}
	_, err := b.stripe.PaymentIntentCreate(ctx, params)
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, stripe.ErrorCode("amount_too_small"), se.Code)
}

// TestTwoNamespacesOneStripeAccount: staging and production share one Stripe
// account (one simulator) and even a customer id; each charges its own and
// never adopts, holds or settles from the other's PaymentIntent.
func TestTwoNamespacesOneStripeAccount(t *testing.T) {
	t.Parallel()
	ctx, staging := setup(t, setupOpts{ledger: ledger.Config{Namespace: "staging"}, webhooks: true})
	prodBundle := ledgertest.New(t, ledger.Config{Namespace: "prod", Clock: staging.Clock.Now})
	prod := &testBundle{Bundle: prodBundle, sim: staging.sim, stripe: staging.stripe, stripeTimeout: staging.stripeTimeout, crash: &crashOnce{}}
	prod.startWorker(t, ctx)

	staging.customerWithEvents(t, ctx, "acme", 300)
	staging.closeNow(t, ctx, "acme")
	s := staging.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	// Production's first call looks at Stripe after staging's PaymentIntent
	// exists for the same Stripe customer.
	prod.customerWithEvents(t, ctx, "acme", 500)
	prod.closeNow(t, ctx, "acme")
	p := prod.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))

	require.NotEqual(t, s.ChargeKey, p.ChargeKey)
	require.NotEqual(t, *s.StripePaymentIntentID, *p.StripePaymentIntentID)
	byID := map[string]*stripe.PaymentIntent{}
	for _, pi := range staging.sim.PaymentIntentList() {
		byID[pi.ID] = pi
	}
	require.Len(t, byID, 2)
	require.Equal(t, "staging", byID[*s.StripePaymentIntentID].Metadata["tally_namespace"])
	require.Equal(t, int64(300), byID[*s.StripePaymentIntentID].Amount)
	require.Equal(t, "prod", byID[*p.StripePaymentIntentID].Metadata["tally_namespace"])
	require.Equal(t, int64(500), byID[*p.StripePaymentIntentID].Amount)

	// The simulator sends every event to staging: production's are ignored.
	deadline := time.Now().Add(waitTimeout)
	for staging.Count(t, `SELECT count(*) FROM billing.stripe_events WHERE status = 'ignored' AND payload::text LIKE '%"prod"%'`) == 0 {
		require.True(t, time.Now().Before(deadline), "production's webhook never reached staging")
		time.Sleep(50 * time.Millisecond)
	}
	s2, err := staging.Ledger.ChargeGet(ctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, *s.StripePaymentIntentID, *s2.StripePaymentIntentID)
	require.Equal(t, ledger.ChargeSucceeded, s2.Status)
}

// TestChargeResolveAfterACrashMidway: a resolve run died after Stripe made
// its refund and before anything was recorded; the next run sends the same
// refund key, Stripe replays it, and exactly one refund exists.
func TestChargeResolveAfterACrashMidway(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	total := b.customerWithEvents(t, ctx, "acme", 700)
	keep := b.lostCall(t, ctx, "acme", total)
	other := b.lostCall(t, ctx, "acme", total)
	b.closeNow(t, ctx, "acme")
	c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))

	// The dead run's refund, made with the run's derived key.
	params := &stripe.RefundParams{PaymentIntent: stripe.String(other.ID), Reason: stripe.String(string(stripe.RefundReasonDuplicate))}
	params.AddMetadata("tally_charge_key", c.ChargeKey)
	params.AddMetadata("charge_id", fmt.Sprint(c.ID))
	params.SetIdempotencyKey(jobs.RefundIdempotencyKey(c.ID, other.ID))
	_, err := b.stripe.RefundCreate(ctx, params)
	require.NoError(t, err)
	require.Len(t, b.sim.RefundList(), 1)

	_, err = b.Ledger.ChargeResolveRequest(ctx, ledger.ChargeResolveRequestParams{
		ChargeActionParams: ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "again"},
		KeepPaymentIntent:  keep.ID,
	})
	require.NoError(t, err)
	b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	require.Len(t, b.sim.RefundList(), 1, "the retried refund was Stripe's stored one")
	require.GreaterOrEqual(t, b.sim.Stats().IdempotentReplays, 1)
	require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.refunds WHERE charge_id = $1`, c.ID))
}

// TestChargeResolveDuplicateRefundedByHand: the operator refunded the
// duplicate in the Dashboard before resolving; the resolve still settles.
func TestChargeResolveDuplicateRefundedByHand(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	total := b.customerWithEvents(t, ctx, "acme", 700)
	keep := b.lostCall(t, ctx, "acme", total)
	other := b.lostCall(t, ctx, "acme", total)
	b.closeNow(t, ctx, "acme")
	c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))

	byHand := &stripe.RefundParams{PaymentIntent: stripe.String(other.ID)}
	byHand.SetIdempotencyKey("dashboard-1")
	_, err := b.stripe.RefundCreate(ctx, byHand)
	require.NoError(t, err)

	_, err = b.Ledger.ChargeResolveRequest(ctx, ledger.ChargeResolveRequestParams{
		ChargeActionParams: ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "already refunded by hand"},
		KeepPaymentIntent:  keep.ID,
	})
	require.NoError(t, err)
	c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
	require.Equal(t, keep.ID, *c.StripePaymentIntentID)
	require.Len(t, b.sim.RefundList(), 1, "no second refund")
}
