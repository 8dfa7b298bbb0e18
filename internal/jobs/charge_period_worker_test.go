package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
)

// waitTimeout bounds every wait for the workers; it is a safety net, never
// an assertion about speed.
const waitTimeout = 90 * time.Second

// customerWithEvents creates customer id with one event per amount in the
// current (November 2026) period and returns the period's total.
func (b *testBundle) customerWithEvents(t *testing.T, ctx context.Context, id string, amounts ...int64) int64 {
	t.Helper()
	b.Customer(t, id)
	var total int64
	for i, a := range amounts {
		_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{
			CustomerID: id, EventID: fmt.Sprintf("%s-ev-%d", id, i), AmountCents: a,
		})
		require.NoError(t, err)
		total += a
	}
	return total
}

// closeNow closes the period as an operator does, making its job run now.
func (b *testBundle) closeNow(t *testing.T, ctx context.Context, customerID string) *ledger.Charge {
	t.Helper()
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{
		CustomerID: customerID, Period: "2026-11", Actor: "operator:test", RunChargeJobNow: true,
	})
	require.NoError(t, err)
	return c
}

// waitCharge polls the charge until cond holds.
func (b *testBundle) waitCharge(t *testing.T, ctx context.Context, customerID string, cond func(c *ledger.Charge) bool) *ledger.Charge {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		c, err := b.Ledger.ChargeGetByPeriod(ctx, customerID, "2026-11")
		if !errors.Is(err, ledger.ErrNotFound) {
			require.NoError(t, err)
		}
		if c != nil && cond(c) {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("charge of %s never reached the expected state; last: %+v\ncharge jobs at %s:\n%s", customerID, c,
				time.Now().UTC().Format(time.RFC3339Nano), b.chargeJobs(ctx))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// chargeJobs lists the test's charge jobs as River has them, for a
// failure's message.
func (b *testBundle) chargeJobs(ctx context.Context) string {
	rows, err := b.Pool.Query(ctx, `
SELECT format('job %s %s attempt %s/%s scheduled %s attempted %s finalized %s last error %s',
              id, state, attempt, max_attempts, scheduled_at, attempted_at, finalized_at, errors[array_upper(errors, 1)])
FROM river.river_job WHERE kind = 'charge_period' ORDER BY id`)
	if err != nil {
		return err.Error()
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	return strings.Join(lines, "\n")
}

func statusIs(status ledger.ChargeStatus) func(c *ledger.Charge) bool {
	return func(c *ledger.Charge) bool { return c.Status == status }
}

// waitJobsFinalized waits until no charge job of the test is left to run.
func (b *testBundle) waitJobsFinalized(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_period' AND finalized_at IS NULL AND scheduled_at < now() + interval '1 day'`) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("charge jobs never finished")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// retrySnoozedCharges waits until no charge job is available or running,
// then makes the snoozed ones (scheduled) run now.
func (b *testBundle) retrySnoozedCharges(t *testing.T, ctx context.Context) {
	t.Helper()
	b.retrySnoozed(t, ctx, "charge_period")
}

// retrySnoozed waits until no job of kind is available or running, then
// makes the snoozed ones (scheduled) run now.
func (b *testBundle) retrySnoozed(t *testing.T, ctx context.Context, kind string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND state IN ('available', 'running', 'retryable', 'pending')`, kind) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s jobs never settled into completed or snoozed", kind)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rows, err := b.Pool.Query(ctx, `SELECT id FROM river.river_job WHERE kind = $1 AND state = 'scheduled'`, kind)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	for _, id := range ids {
		_, err := b.worker.JobRetry(ctx, id)
		require.NoError(t, err)
	}
}

// paymentIntents returns the PaymentIntents the simulator created for a
// Stripe customer.
func (b *testBundle) paymentIntents(stripeCustomer string) []string {
	var ids []string
	for _, pi := range b.sim.PaymentIntentList() {
		if pi.Customer != nil && pi.Customer.ID == stripeCustomer {
			ids = append(ids, pi.ID)
		}
	}
	return ids
}

func (b *testBundle) fault(t *testing.T, f stripesim.Fault) {
	t.Helper()
	require.NoError(t, b.sim.FaultAdd(f))
}

// attempts returns the outcome of each Stripe call logged for the charge
// ("" for a call whose worker died before recording it).
func (b *testBundle) attempts(t *testing.T, ctx context.Context, chargeID int64) []string {
	t.Helper()
	rows, err := b.Pool.Query(ctx, `SELECT coalesce(outcome, '') FROM billing.charge_attempts WHERE charge_id = $1 ORDER BY id`, chargeID)
	require.NoError(t, err)
	outcomes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return outcomes
}

// expireLeases ends every lease, as time passing after a worker's death
// would (leases live on Postgres's clock).
func (b *testBundle) expireLeases() {
	_, err := b.Pool.Exec(context.Background(), `
UPDATE billing.charges SET lease_expires_at = now() - interval '1 second' WHERE lease_owner IS NOT NULL`)
	if err != nil {
		panic(err)
	}
}

func TestChargePeriodWorker(t *testing.T) {
	t.Parallel()

	t.Run("AuthenticationRequiredFails", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 500)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindAuthenticationRequired})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeFailed))
		require.Equal(t, "authentication_required", *c.FailureCode)
		b.waitJobsFinalized(t)
		require.Equal(t, []string{"failed"}, b.attempts(t, ctx, c.ID))
	})

	t.Run("CrashAfterClaimBeforeStripe", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{crashAt: jobs.CrashAfterClaim})
		total := b.customerWithEvents(t, ctx, "acme", 100, 250)
		b.closeNow(t, ctx, "acme")
		// The dead run's lease blocks every retry until it expires.
		b.waitCrashed(t)
		c := b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.LeaseOwner != nil })
		require.Empty(t, b.paymentIntents("cus_acme"))
		// It looked at Stripe before the close, found nothing, and its claim
		// committed the key's first use and its attempt with the close.
		require.NotNil(t, c.GenerationFirstAttemptedAt, "the claim marked the key's first use")
		require.Equal(t, []string{""}, b.attempts(t, ctx, c.ID))
		b.expireLeases()

		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		pis := b.paymentIntents("cus_acme")
		require.Len(t, pis, 1)
		require.Equal(t, pis[0], *c.StripePaymentIntentID)
		require.Equal(t, total, c.AmountCents)
		require.Equal(t, 0, c.KeyGeneration)
		require.Equal(t, []string{"", "succeeded"}, b.attempts(t, ctx, c.ID))
		require.Equal(t, 1, b.sim.Stats().Requests["GET /v1/payment_intents"]["ok"],
			"the dead run looked at Stripe before its claim; an attempt of the generation is on record, so the retry calls with the same key")
		b.waitJobsFinalized(t)
	})

	t.Run("CrashAfterLookupBeforeStripe", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{crashAt: jobs.CrashAfterLookup})
		b.customerWithEvents(t, ctx, "acme", 100, 250)
		// The look-up before the claim fails, so the run looks after it.
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindListError500, Count: 1})
		b.closeNow(t, ctx, "acme")
		// The dead run found nothing on Stripe and committed its key and attempt.
		b.waitCrashed(t)
		c := b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.LeaseOwner != nil })
		require.NotNil(t, c.GenerationFirstAttemptedAt)
		require.Empty(t, b.paymentIntents("cus_acme"))
		b.expireLeases()

		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID})
		require.Equal(t, 0, c.KeyGeneration)
		require.Equal(t, []string{"", "succeeded"}, b.attempts(t, ctx, c.ID))
		require.Equal(t, 1, b.sim.Stats().Requests["GET /v1/payment_intents"]["ok"],
			"an attempt of the generation is on record: the retry calls with the same key, no second look-up")
		b.waitJobsFinalized(t)
	})

	t.Run("CrashAfterStripeBeforeOutcome", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{crashAt: jobs.CrashAfterStripe})
		b.customerWithEvents(t, ctx, "acme", 100)
		b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return b.crash.done() })
		require.Len(t, b.paymentIntents("cus_acme"), 1, "the PaymentIntent exists, the ledger does not know it yet")
		b.expireLeases()

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID})
		require.Equal(t, 1, b.sim.Stats().IdempotentReplays, "the retry got Stripe's stored answer")
		require.Equal(t, []string{"", "succeeded"}, b.attempts(t, ctx, c.ID))
	})

	t.Run("CrashBeforeJobCompletion", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{crashAt: jobs.CrashBeforeComplete})
		b.customerWithEvents(t, ctx, "acme", 100)
		charge := b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return b.crash.done() })
		// The outcome and the job completion share a transaction: both rolled back.
		c, err := b.Ledger.ChargeGet(ctx, charge.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePending, c.Status)
		b.expireLeases()

		b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Len(t, b.paymentIntents("cus_acme"), 1)
		b.waitJobsFinalized(t)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_period' AND state = 'completed'`))
	})

	t.Run("Decline", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 500)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindDecline, DeclineCode: "insufficient_funds"})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeFailed))
		require.Equal(t, "card_declined", *c.FailureCode)
		require.Contains(t, *c.FailureMessage, "insufficient_funds")
		b.waitJobsFinalized(t)
		require.Equal(t, []string{"failed"}, b.attempts(t, ctx, c.ID), "a decline is final: no retry")
	})

	t.Run("DropAfterCreateRetriesWithSameKey", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 700)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindDropAfterCreate, Count: 1})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID})
		require.Equal(t, 1, b.sim.Stats().IdempotentReplays, "the retry got the stored success")
		// Go's http.Transport itself retries a request carrying an
		// Idempotency-Key when a reused connection breaks before any answer,
		// so the drop may surface as an unknown attempt or be retried inside
		// the first one: with the same key either way.
		attempts := b.attempts(t, ctx, c.ID)
		require.Equal(t, "succeeded", attempts[len(attempts)-1])
		require.Subset(t, []string{"unknown", "succeeded"}, attempts)
	})

	t.Run("DuplicateRunAfterSuccessMakesNoCall", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 100)
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		b.waitJobsFinalized(t)

		// A redrive or manual retry of the completed job.
		p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
		require.NoError(t, err)
		_, err = b.worker.JobRetry(ctx, *p.ChargeJobID)
		require.NoError(t, err)
		b.waitJobsFinalized(t)
		require.Len(t, b.paymentIntents("cus_acme"), 1)
		require.Equal(t, []string{"succeeded"}, b.attempts(t, ctx, c.ID))
	})

	t.Run("Error500AfterCreateStaysUnknown", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 300)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindError500AfterCreate, Count: 1})
		b.closeNow(t, ctx, "acme")
		// Stripe replays the stored 500 to every retry with the same key.
		c := b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return c.AttemptCount >= 3 })
		require.Equal(t, ledger.ChargeUnknown, c.Status)
		require.Len(t, b.paymentIntents("cus_acme"), 1, "never a second PaymentIntent")
		// The third attempt counts when it is claimed, before its call
		// reaches Stripe: wait for the call.
		require.Eventually(t, func() bool { return b.sim.Stats().IdempotentReplays >= 2 }, 30*time.Second, 10*time.Millisecond,
			"replays: %d", b.sim.Stats().IdempotentReplays)
	})

	t.Run("IdempotencyErrorIsHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{crashAt: jobs.CrashAfterStripe})
		b.customerWithEvents(t, ctx, "acme", 100)
		charge := b.closeNow(t, ctx, "acme")
		b.waitCharge(t, ctx, "acme", func(c *ledger.Charge) bool { return b.crash.done() })
		// A bug changes the charge's parameters under the same key.
		_, err := b.Pool.Exec(ctx, `UPDATE billing.charges SET amount_cents = amount_cents + 1 WHERE id = $1`, charge.ID)
		require.NoError(t, err)
		b.expireLeases()

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))
		require.Contains(t, *c.HeldReason, "idempotency_error")
		require.Len(t, b.paymentIntents("cus_acme"), 1)
	})

	t.Run("Processing", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 100)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindProcessing})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeProcessing))
		require.NotNil(t, c.StripePaymentIntentID)
		b.waitJobsFinalized(t)
	})

	t.Run("RateLimitSnoozesThenSucceeds", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 100)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindRateLimit, Count: 2})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, []string{"retry_later", "retry_later", "succeeded"}, b.attempts(t, ctx, c.ID))
		require.Len(t, b.paymentIntents("cus_acme"), 1)
	})

	t.Run("RequiresActionFails", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 100)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindRequiresAction})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeFailed))
		require.Equal(t, "requires_action", *c.FailureCode)
	})

	t.Run("SucceedsWithSnapshotParameters", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		total := b.customerWithEvents(t, ctx, "acme", 1250, 99, 1)
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		b.waitJobsFinalized(t)

		pis := b.sim.PaymentIntentList()
		require.Len(t, pis, 1)
		pi := pis[0]
		require.Equal(t, total, pi.Amount)
		require.Equal(t, "usd", string(pi.Currency))
		require.Equal(t, "pm_card_visa", pi.PaymentMethod.ID, "the Stripe customer's default payment method")
		require.Equal(t, map[string]string{
			"tally_charge_key": ledger.ChargeKey("default", "acme", "2026-11"), "tally_namespace": "default", "customer_id": "acme",
			"period": "2026-11", "charge_id": fmt.Sprint(c.ID),
		}, pi.Metadata)
		require.Equal(t, pi.ID, *c.StripePaymentIntentID)
		require.NotNil(t, c.StripeChargeID)
		require.Equal(t, "stripe_response", *c.ResolvedBy)
		require.Nil(t, c.LeaseOwner)
		require.Equal(t, int64(3), c.EventCount)

		p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
		require.NoError(t, err)
		require.Equal(t, ledger.PeriodClosed, p.Status)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_period' AND state = 'completed'`))
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.charge_transitions WHERE charge_id = $1`, c.ID))
	})

	t.Run("TimeoutThenSameKeySucceeds", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{stripeTimeout: time.Second})
		b.customerWithEvents(t, ctx, "acme", 100)
		// The first call times out while Stripe goes on and creates the
		// PaymentIntent; retries meet the key in use, then its stored result.
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindLatency, Latency: 3 * time.Second, Count: 1})
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID})
		require.Equal(t, "unknown", b.attempts(t, ctx, c.ID)[0])
	})

	t.Run("TwoRunsRaceOnOneCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.startWorker(t, ctx) // a second replica
		b.customerWithEvents(t, ctx, "acme", 100)
		// Hold the first run inside Stripe while the second arrives.
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindLatency, Latency: 2 * time.Second, Count: 1})
		// A duplicate job for the same charge, as a rescued job whose first
		// run still lives would be.
		_, err := b.Pool.Exec(ctx, `
INSERT INTO river.river_job (args, kind, max_attempts, queue, state)
VALUES ('{"customer_id":"acme","period":"2026-11"}', 'charge_period', 25, 'charges', 'available')`)
		require.NoError(t, err)
		b.closeNow(t, ctx, "acme")

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		// The run that found the lease held snoozed until the lease would
		// expire (30 s here): wake it, as the time passing would.
		b.retrySnoozedCharges(t, ctx)
		b.waitJobsFinalized(t)
		require.Equal(t, b.paymentIntents("cus_acme"), []string{*c.StripePaymentIntentID})
		require.Equal(t, []string{"succeeded"}, b.attempts(t, ctx, c.ID), "the second run never called Stripe")
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_period' AND state = 'completed'`))
	})

	t.Run("ZeroTotalIsSkipped", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.Customer(t, "acme")
		// A period without events (ingest never leaves one; a later
		// adjustment feature could).
		_, err := b.Pool.Exec(ctx, `
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, created_at)
VALUES ('acme', '2026-11', 'usd', '2026-11-01', '2026-12-01', '2026-12-01 01:00', now())`)
		require.NoError(t, err)
		_, err = b.River.Insert(ctx, jobs.ChargePeriodArgs{CustomerID: "acme", Period: "2026-11"}, nil)
		require.NoError(t, err)
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSkipped))
		require.Zero(t, c.AmountCents)
		b.waitJobsFinalized(t)
		require.Empty(t, b.sim.PaymentIntentList())
		require.Empty(t, b.attempts(t, ctx, c.ID))
	})
}
