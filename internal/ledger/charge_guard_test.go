package ledger_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// guardBundle is a ledger with config (guards set) and a buffer of its logs.
func guardBundle(t *testing.T, config ledger.Config) (context.Context, *testBundle, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	config.Logger = slog.New(slog.NewTextHandler(logs, nil))
	ctx, b := setup(t, setupOpts{ledger: config, noCustomer: true})
	return ctx, b, logs
}

// closedWith creates customer id with one event of amount and closes its
// November charge, pending.
func closedWith(t *testing.T, ctx context.Context, b *testBundle, id string, amount int64) *ledger.Charge {
	t.Helper()
	b.Customer(t, id)
	_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: id, EventID: "e1", AmountCents: amount})
	require.NoError(t, err)
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: id, Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	require.Equal(t, ledger.ChargePending, c.Status)
	return c
}

// claim claims c as a worker run does and returns the claim (nil when the
// guards held the charge) and the charge as stored.
func claim(t *testing.T, ctx context.Context, b *testBundle, c *ledger.Charge) (*ledger.Claim, *ledger.Charge) {
	t.Helper()
	cl, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
	require.NoError(t, err)
	got, err := b.Ledger.ChargeGet(ctx, c.ID)
	require.NoError(t, err)
	return cl, got
}

func spend(t *testing.T, ctx context.Context, b *testBundle) int64 {
	t.Helper()
	s, err := b.Ledger.PeriodSpendGet(ctx, "2026-11", "usd")
	require.NoError(t, err)
	return s.ReservedCents
}

func TestChargeGuards(t *testing.T) {
	t.Parallel()

	t.Run("AnomalyHoldsAboveFactorTimesMedian", func(t *testing.T) {
		t.Parallel()
		ctx, b, logs := guardBundle(t, ledger.Config{AnomalyFactor: 10})
		b.Customer(t, "acme")
		// Three earlier succeeded charges: 90, 100, 120 → median 100.
		for i, amount := range []int64{90, 100, 120} {
			period := fmt.Sprintf("2026-0%d", i+5)
			_, err := b.Pool.Exec(ctx, `
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, status, closed_at, created_at)
VALUES ('acme', $1, 'usd', $2, $2::timestamptz + interval '1 month', $2::timestamptz + interval '1 month', 'closed', now(), now())`,
				period, period+"-01")
			require.NoError(t, err)
			_, err = b.Pool.Exec(ctx, `
INSERT INTO billing.charges (customer_id, period, status, amount_cents, currency, event_count, stripe_customer_id,
                             charge_key, idempotency_key, stripe_payment_intent_id, period_starts_at, created_at, updated_at)
VALUES ('acme', $1, 'succeeded', $2, 'usd', 1, 'cus_acme', $1, $1, 'pi_' || $1, $3, now(), now())`, period, amount, period+"-01")
			require.NoError(t, err)
		}
		_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "e1", AmountCents: 1001})
		require.NoError(t, err)
		c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
		require.NoError(t, err)

		cl, got := claim(t, ctx, b, c)
		require.Nil(t, cl)
		require.Equal(t, ledger.ChargeHeld, got.Status)
		require.Equal(t, ledger.HeldAnomaly, *got.HeldReason)
		require.Contains(t, *got.HeldDetail, "10 × 100")
		require.Contains(t, logs.String(), "alert=charge_held")
		require.Contains(t, logs.String(), fmt.Sprintf("billingctl charges approve %d", c.ID))
	})

	t.Run("AnomalyNeedsThreeCharges", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{AnomalyFactor: 10})
		c := closedWith(t, ctx, b, "acme", 1_000_000)
		cl, got := claim(t, ctx, b, c)
		require.NotNil(t, cl, "a first charge has no history to compare with")
		require.Equal(t, ledger.ChargePending, got.Status)
	})

	t.Run("ApprovedChargeSkipsTheCap", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{})
		c := closedWith(t, ctx, b, "acme", 500)
		limit := int64(100)
		_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd", MaxChargeCents: &limit})
		require.NoError(t, err)
		_, held := claim(t, ctx, b, c)
		require.Equal(t, ledger.HeldOverCustomerCap, *held.HeldReason)

		approved, err := b.Ledger.ChargeApprove(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "agreed with the customer"})
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePending, approved.Status)
		require.False(t, approved.LookupRequired, "never called: no mark needed")
		cl, _ := claim(t, ctx, b, c)
		require.NotNil(t, cl)
		require.True(t, cl.Lookup)

		actions, err := b.Ledger.ChargeActions(ctx, c.ID)
		require.NoError(t, err)
		require.Len(t, actions, 1)
		require.Equal(t, ledger.ActionApprove, actions[0].Action)
		require.Equal(t, "operator:ops/tly_1", actions[0].Actor)
		require.Equal(t, "agreed with the customer", actions[0].Reason)
		require.Equal(t, ledger.ChargeHeld, *actions[0].StatusBefore)
		require.Equal(t, ledger.ChargePending, *actions[0].StatusAfter)
	})

	t.Run("GuardsReadWithoutAKillSwitch", func(t *testing.T) {
		// The cap and the history are queued to go with the kill switch's
		// read; a ledger with no kill switch (no scheduler) sends them itself.
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{})
		limit := int64(100)
		over := closedWith(t, ctx, b, "acme", 500)
		under := closedWith(t, ctx, b, "beta", 50)
		for _, id := range []string{"acme", "beta"} {
			_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: id, StripeCustomerID: "cus_" + id, Currency: "usd", MaxChargeCents: &limit})
			require.NoError(t, err)
		}
		bare, err := ledger.New(b.Pool, ledger.Config{Clock: b.Clock.Now, AnomalyFactor: 10})
		require.NoError(t, err)

		cl, err := bare.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: over.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
		require.NoError(t, err)
		require.Nil(t, cl)
		held, err := b.Ledger.ChargeGet(ctx, over.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.HeldOverCustomerCap, *held.HeldReason)

		cl, err = bare.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: under.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
		require.NoError(t, err)
		require.NotNil(t, cl)
		require.True(t, cl.Charge.BudgetReserved)
	})

	t.Run("BudgetReservesHoldsAndReleases", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{PeriodBudgetCents: 250})
		a, bb, c := closedWith(t, ctx, b, "a", 100), closedWith(t, ctx, b, "b", 100), closedWith(t, ctx, b, "c", 100)

		claimA, _ := claim(t, ctx, b, a)
		require.NotNil(t, claimA)
		claimB, _ := claim(t, ctx, b, bb)
		require.NotNil(t, claimB)
		require.Equal(t, int64(200), spend(t, ctx, b))
		cl, held := claim(t, ctx, b, c)
		require.Nil(t, cl)
		require.Equal(t, ledger.HeldOverPeriodBudget, *held.HeldReason)
		require.Contains(t, *held.HeldDetail, "over the budget of 250")
		require.Equal(t, int64(200), spend(t, ctx, b), "a held charge reserves nothing")

		// A retry of a reserved charge is not checked again.
		_, err := b.Ledger.ChargeRecordOutcome(ctx, claimA, ledger.Outcome{Class: ledger.OutcomeRetryLater}, "job:1/1", nil)
		require.NoError(t, err)
		claimA, _ = claim(t, ctx, b, a)
		require.NotNil(t, claimA)
		require.Equal(t, int64(200), spend(t, ctx, b))

		// A failure releases; a success keeps.
		_, err = b.Ledger.ChargeRecordOutcome(ctx, claimA, ledger.Outcome{Class: ledger.OutcomeFailed, ErrorCode: "card_declined"}, "job:1/1", nil)
		require.NoError(t, err)
		require.Equal(t, int64(100), spend(t, ctx, b))
		_, err = b.Ledger.ChargeRecordOutcome(ctx, claimB, ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_b"}, "job:1/1", nil)
		require.NoError(t, err)
		require.Equal(t, int64(100), spend(t, ctx, b))

		// The operator approves c: charged even if over budget, and counted.
		_, err = b.Ledger.ChargeApprove(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "budget raised"})
		require.NoError(t, err)
		cl, got := claim(t, ctx, b, c)
		require.NotNil(t, cl)
		require.NotNil(t, got.ApprovedAt)
		require.True(t, got.BudgetReserved)
		require.Equal(t, int64(200), spend(t, ctx, b))
	})

	t.Run("ConcurrentClaimsNeverOverspendTheBudget", func(t *testing.T) {
		t.Parallel()
		// 12 charges of 100 claimed at once against a budget of 500: the
		// check and the reservation are atomic per (period, currency), so
		// exactly five reserve and seven are held.
		ctx, b, _ := guardBundle(t, ledger.Config{PeriodBudgetCents: 500})
		var charges []*ledger.Charge
		for i := range 12 {
			charges = append(charges, closedWith(t, ctx, b, fmt.Sprintf("cust-%02d", i), 100))
		}
		var wg sync.WaitGroup
		for _, c := range charges {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: c.ID, JobAttempt: 1})
				require.NoError(t, err)
			}()
		}
		wg.Wait()
		require.Equal(t, int64(500), spend(t, ctx, b))
		require.Equal(t, int64(5), b.Count(t, `SELECT count(*) FROM billing.charges WHERE budget_reserved`))
		require.Equal(t, int64(7), b.Count(t, `SELECT count(*) FROM billing.charges WHERE status = 'held' AND held_reason = 'over_period_budget'`))
	})

	t.Run("HeldIsReportedAgainDaily", func(t *testing.T) {
		t.Parallel()
		ctx, b, logs := guardBundle(t, ledger.Config{PeriodBudgetCents: 1})
		c := closedWith(t, ctx, b, "acme", 500)
		claim(t, ctx, b, c)
		n, err := b.Ledger.ChargeHeldReport(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "just held: the transition's alert is enough")
		b.Clock.Advance(25 * time.Hour)
		n, err = b.Ledger.ChargeHeldReport(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Contains(t, logs.String(), "still held after 25h0m0s")
		n, err = b.Ledger.ChargeHeldReport(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "once a day")
		b.Clock.Advance(25 * time.Hour)
		n, err = b.Ledger.ChargeHeldReport(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		counts, err := b.Ledger.ChargeHeldCount(ctx)
		require.NoError(t, err)
		require.Equal(t, map[ledger.HeldReason]int64{ledger.HeldOverPeriodBudget: 1}, counts)
	})

	t.Run("LongPauseIsAlerted", func(t *testing.T) {
		t.Parallel()
		ctx, b, logs := guardBundle(t, ledger.Config{})
		reported, err := b.Ledger.ChargingReport(ctx, 0)
		require.NoError(t, err)
		require.False(t, reported, "not paused")
		_, err = b.Ledger.ChargingPause(ctx, "cli:ops", "incident 42")
		require.NoError(t, err)
		reported, err = b.Ledger.ChargingReport(ctx, ledger.ChargingPausedAlertAfter)
		require.NoError(t, err)
		require.False(t, reported, "just paused")
		reported, err = b.Ledger.ChargingReport(ctx, 0)
		require.NoError(t, err)
		require.True(t, reported)
		require.Contains(t, logs.String(), "alert=charging_paused")
		require.Contains(t, logs.String(), "billingctl charging resume")
	})

	t.Run("PausedChargingRefusesClaims", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{})
		c := closedWith(t, ctx, b, "acme", 500)
		st, err := b.Ledger.ChargingPause(ctx, "operator:ops/tly_1", "incident 42")
		require.NoError(t, err)
		require.True(t, st.Paused)
		require.Equal(t, "operator:ops/tly_1", st.By)
		require.Equal(t, "incident 42", st.Reason)
		require.NotNil(t, st.Since)

		_, err = b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute})
		require.ErrorIs(t, err, ledger.ErrChargingPaused)
		got, err := b.Ledger.ChargeGet(ctx, c.ID)
		require.NoError(t, err)
		require.Nil(t, got.LeaseOwner)
		require.Zero(t, got.AttemptCount)

		st, err = b.Ledger.ChargingResume(ctx, "cli:ops", "incident over")
		require.NoError(t, err)
		require.False(t, st.Paused)
		require.Equal(t, "cli:ops", st.By)
		cl, _ := claim(t, ctx, b, c)
		require.NotNil(t, cl)
	})
}

func TestChargeOperatorActions(t *testing.T) {
	t.Parallel()
	act := func(id int64) ledger.ChargeActionParams {
		return ledger.ChargeActionParams{ChargeID: id, Actor: "operator:ops/tly_1", Reason: "checked"}
	}
	conflict := func(t *testing.T, err error, code string) {
		t.Helper()
		var ce *ledger.ConflictError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, code, ce.Code)
	}

	t.Run("ApproveRefusesADoubleCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{})
		c := closedWith(t, ctx, b, "acme", 500)
		_, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "reconciler",
			Outcome: ledger.Outcome{Class: ledger.OutcomeHeld, HeldReason: ledger.HeldDoubleCharge, ErrorMessage: "pi_1, pi_2"}})
		require.NoError(t, err)
		_, err = b.Ledger.ChargeApprove(ctx, act(c.ID))
		conflict(t, err, ledger.ConflictChargeNotHeld)
		require.ErrorContains(t, err, "resolve it instead")
		_, err = b.Ledger.ChargeCancel(ctx, act(c.ID))
		conflict(t, err, ledger.ConflictChargeOutcomeUnknown)

		_, err = b.Ledger.ChargeResolveRequest(ctx, ledger.ChargeResolveRequestParams{ChargeActionParams: act(c.ID), KeepPaymentIntent: "nope"})
		var ve *ledger.ValidationError
		require.ErrorAs(t, err, &ve)
		got, err := b.Ledger.ChargeResolveRequest(ctx, ledger.ChargeResolveRequestParams{ChargeActionParams: act(c.ID), KeepPaymentIntent: "pi_1"})
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeHeld, got.Status, "held until the resolve job is done")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_resolve'`))
	})

	t.Run("ApproveRefusesWhatIsNotHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{})
		c := closedWith(t, ctx, b, "acme", 500)
		_, err := b.Ledger.ChargeApprove(ctx, act(c.ID))
		conflict(t, err, ledger.ConflictChargeNotHeld)
		_, err = b.Ledger.ChargeApprove(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:x"})
		var ve *ledger.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Contains(t, ve.Fields["reason"], "is required")
		_, err = b.Ledger.ChargeApprove(ctx, act(999))
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})

	t.Run("CancelOnlyWhereNoMoneyMoved", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{PeriodBudgetCents: 10_000})
		never := closedWith(t, ctx, b, "never", 500)
		unknown := closedWith(t, ctx, b, "unknown", 500)

		cl, _ := claim(t, ctx, b, unknown)
		cl, err := b.Ledger.ChargeLookupNone(ctx, cl, "job:1/1")
		require.NoError(t, err)
		_, err = b.Ledger.ChargeCancel(ctx, act(unknown.ID))
		conflict(t, err, ledger.ConflictChargeLeased)
		_, err = b.Ledger.ChargeRecordOutcome(ctx, cl, ledger.Outcome{Class: ledger.OutcomeUnknown}, "job:1/1", nil)
		require.NoError(t, err)
		_, err = b.Ledger.ChargeCancel(ctx, act(unknown.ID))
		conflict(t, err, ledger.ConflictChargeOutcomeUnknown)
		require.Equal(t, int64(500), spend(t, ctx, b))

		canceled, err := b.Ledger.ChargeCancel(ctx, act(never.ID))
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeCanceled, canceled.Status)
		_, err = b.Ledger.ChargeCancel(ctx, act(never.ID))
		conflict(t, err, ledger.ConflictChargeNotCancelable)
		cl, err = b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: never.ID, Owner: "w", LeaseTTL: time.Minute})
		require.NoError(t, err)
		require.Nil(t, cl, "a canceled charge is never claimed")
	})

	t.Run("CancelRefusedWhileTheRecordMayBeIncomplete", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{})
		c := closedWith(t, ctx, b, "acme", 500)
		_, err := b.Ledger.ChargeLookupMark(ctx, "cli:ops", "restored the 03:00 backup")
		require.NoError(t, err)
		_, err = b.Ledger.ChargeCancel(ctx, act(c.ID))
		conflict(t, err, ledger.ConflictChargeOutcomeUnknown)

		// A success for a charge settled without it is never silent.
		other := closedWith(t, ctx, b, "other", 500)
		_, err = b.Ledger.ChargeCancel(ctx, act(other.ID))
		require.NoError(t, err)
		_, err = b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: other.ID, Actor: "webhook:evt_1",
			Outcome: ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_late"}})
		require.NoError(t, err)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.charge_transitions WHERE charge_id = $1 AND reason LIKE 'ALERT%pi_late succeeded%'`, other.ID))
	})

	t.Run("CancelReleasesTheReservation", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{PeriodBudgetCents: 10_000})
		c := closedWith(t, ctx, b, "acme", 500)
		cl, _ := claim(t, ctx, b, c)
		require.Equal(t, int64(500), spend(t, ctx, b))
		// Stripe said 429 before anything happened: nothing moved.
		cl, err := b.Ledger.ChargeLookupNone(ctx, cl, "job:1/1")
		require.NoError(t, err)
		_, err = b.Ledger.ChargeRecordOutcome(ctx, cl, ledger.Outcome{Class: ledger.OutcomeRetryLater}, "job:1/1", nil)
		require.NoError(t, err)
		got, err := b.Ledger.ChargeCancel(ctx, act(c.ID))
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeCanceled, got.Status)
		require.False(t, got.BudgetReserved)
		require.Zero(t, spend(t, ctx, b))
	})
}
