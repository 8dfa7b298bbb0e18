package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripeapi"
)

// Timing of the charge path, derived from the Stripe timeout T so that the
// invariants hold whatever it is configured to, with m = max(T, 10 s):
//
//	job timeout  = 2T + m             (customer lookup + create + ledger steps)
//	lease TTL    = job timeout + m    (a live run always holds its lease)
//	rescue after = lease TTL + m      (River re-runs a job only after its lease is gone)
//
// With the default T = 30 s: 90 s, 120 s, 150 s. River's rescuer may still
// re-run a job whose worker is alive but stalled; that run finds the lease
// held and snoozes, and even a lost race sends the same idempotency key.
func ChargeTimings(stripeTimeout time.Duration) (jobTimeout, leaseTTL, rescueAfter time.Duration) {
	margin := max(stripeTimeout, 10*time.Second)
	jobTimeout = 2*stripeTimeout + margin
	leaseTTL = jobTimeout + margin
	rescueAfter = leaseTTL + margin
	return jobTimeout, leaseTTL, rescueAfter
}

// Snooze bounds when Stripe says "not now" (429, key in use).
const (
	retryLaterSnoozeMin = 2 * time.Second
	retryLaterSnoozeMax = 20 * time.Second
)

// errCrash is returned by a crash hook: the run stops there as if the
// process died, leaving its lease and attempt row as they are.
var errCrash = errors.New("simulated crash")

// ChargePeriodWorker charges one (customer, period) — DESIGN.md's money path,
// steps 1 to 5, each step its own transaction in internal/ledger:
//
//  1. close the period and find or create its charge (pre-flight);
//  2. claim the charge's lease, committed before any money moves;
//  3. when this database cannot prove Stripe never saw the charge or still
//     knows its key, look for the charge's PaymentIntents on Stripe first;
//  4. create the PaymentIntent with the charge's idempotency key;
//  5. record the outcome and complete the job in one transaction.
type ChargePeriodWorker struct {
	river.WorkerDefaults[ChargePeriodArgs]

	ledger        *ledger.Ledger
	stripe        Stripe
	logger        *slog.Logger
	jobTimeout    time.Duration
	leaseTTL      time.Duration
	stripeTimeout time.Duration
	host          string

	// retryLaterMin and retryLaterMax bound the jittered snooze after 429
	// or idempotency_key_in_use.
	retryLaterMin, retryLaterMax time.Duration

	// crashHook, when set (tests only), is called at each crash point and
	// stops the run there if it returns an error.
	crashHook func(point string) error
}

// Crash points of the charge path, in order.
const (
	crashAfterClaim     = "after_claim"     // lease committed, Stripe not called
	crashAfterLookup    = "after_lookup"    // look-up found nothing; key and attempt committed, Stripe not called
	crashAfterStripe    = "after_stripe"    // Stripe answered, outcome not written
	crashBeforeComplete = "before_complete" // outcome written in the open transaction, job not completed
)

func (w *ChargePeriodWorker) crash(point string) error {
	if w.crashHook == nil {
		return nil
	}
	return w.crashHook(point)
}

// Timeout bounds one run; see ChargeTimings.
func (w *ChargePeriodWorker) Timeout(*river.Job[ChargePeriodArgs]) time.Duration { return w.jobTimeout }

// Work runs the charge of job's (customer, period) to an outcome.
func (w *ChargePeriodWorker) Work(ctx context.Context, job *river.Job[ChargePeriodArgs]) error {
	actor := fmt.Sprintf("job:%d/%d", job.ID, job.Attempt)
	logger := w.logger.With(slog.String("customer_id", job.Args.CustomerID), slog.String("period", job.Args.Period),
		slog.Int64("job_id", job.ID), slog.Int("job_attempt", job.Attempt))

	// 1. Close + pre-flight.
	charge, err := w.ledger.PeriodClose(ctx, ledger.PeriodCloseParams{
		CustomerID: job.Args.CustomerID, Period: job.Args.Period, Actor: actor,
	})
	if err != nil {
		return err
	}
	if !charge.Status.Chargeable() {
		logger.InfoContext(ctx, "charge needs no stripe call", slog.Int64("charge_id", charge.ID), slog.String("status", string(charge.Status)))
		return nil
	}
	if charge.StripePaymentMethodID == nil && charge.FirstAttemptedAt == nil {
		if charge, err = w.snapshotPaymentMethod(ctx, charge); err != nil {
			return err
		}
	}

	// 2. Claim.
	claim, err := w.ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{
		ChargeID: charge.ID, Owner: w.owner(job), LeaseTTL: w.leaseTTL, JobID: job.ID, JobAttempt: job.Attempt,
	})
	var held *ledger.LeaseHeldError
	if errors.As(err, &held) {
		wait := max(held.Left, time.Second) + jitter(time.Second)
		logger.InfoContext(ctx, "charge leased by another run; snoozing", slog.String("lease_owner", held.Owner), slog.Duration("snooze", wait))
		return river.JobSnooze(wait)
	}
	if errors.Is(err, ledger.ErrChargingPaused) {
		logger.InfoContext(ctx, "charging is paused (kill switch); snoozing", slog.Duration("snooze", chargingPausedSnooze))
		return river.JobSnooze(chargingPausedSnooze)
	}
	if err != nil {
		return err
	}
	if claim == nil {
		return nil // settled between pre-flight and claim
	}
	claimedAt := time.Now() // monotonic: how long this run has held the lease
	if err := w.crash(crashAfterClaim); err != nil {
		return err
	}

	// 3. Decide the key. Tally's own record can be lost (a restored backup,
	// a failover that drops the last commits) and Stripe forgets a key after
	// 24 h, so unless this database holds an attempt of the key's generation
	// within the key window, look for the charge's PaymentIntents first.
	if claim.Lookup {
		var done bool
		if claim, done, err = w.lookUp(ctx, job, claim, claimedAt, actor, logger); err != nil || done {
			return err
		}
	}

	// 4. Call Stripe: parameters and key are a pure function of the charge
	// row. A run that stalled (GC, a paused VM) must not call once its lease
	// may have passed to another run, which may already have moved on.
	if err := w.leaseLeft(ctx, claimedAt); err != nil {
		w.release(ctx, claim, logger)
		return err
	}
	pi, err := w.stripe.PaymentIntentCreate(ctx, stripeapi.PaymentIntentParams(claim.Charge))
	outcome := stripeapi.Classify(pi, err)
	if err := w.crash(crashAfterStripe); err != nil {
		return err
	}

	// 5. Record the outcome; complete the job in the same transaction. The
	// answer is recorded even if the job's deadline passed meanwhile.
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	charge, err = w.ledger.ChargeRecordOutcome(recordCtx, claim, outcome, actor, func(ctx context.Context, tx pgx.Tx) error {
		if err := w.crash(crashBeforeComplete); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
	if err != nil {
		return err
	}
	attrs := []any{slog.Int64("charge_id", charge.ID), slog.String("outcome", string(outcome.Class)),
		slog.String("status", string(charge.Status)), slog.String("payment_intent", outcome.StripePaymentIntentID),
		slog.String("stripe_request_id", outcome.StripeRequestID), slog.Int("http_status", outcome.HTTPStatus),
		slog.String("error_code", outcome.ErrorCode)}
	switch outcome.Class {
	case ledger.OutcomeUnknown:
		logger.WarnContext(ctx, "charge outcome unknown; retrying with the same key", attrs...)
		return fmt.Errorf("charge %d outcome unknown (%s %s): %s", charge.ID, outcome.ErrorType, outcome.ErrorCode, outcome.ErrorMessage)
	case ledger.OutcomeError:
		logger.ErrorContext(ctx, "stripe refused the request; retrying with backoff", attrs...)
		return fmt.Errorf("charge %d refused by stripe (%d %s): %s", charge.ID, outcome.HTTPStatus, outcome.ErrorCode, outcome.ErrorMessage)
	case ledger.OutcomeRetryLater:
		wait := w.retryLaterMin + jitter(w.retryLaterMax-w.retryLaterMin)
		logger.InfoContext(ctx, "stripe asked to retry later; snoozing", append(attrs, slog.Duration("snooze", wait))...)
		return river.JobSnooze(wait)
	default: // a hold is alerted by the ledger (alert=charge_held)
		logger.InfoContext(ctx, "charge attempted", attrs...)
	}
	return nil
}

// lookUp is step 3 for a claim that needs a look-up (ledger.Claim.Lookup):
// one PaymentIntent of the charge found → the charge takes its outcome and the
// job completes (done); several, or one that differs from the charge → held
// (done); none → ChargeLookupNone commits the key to call with (the next
// generation when the key expired) and the attempt row, and the returned
// claim calls Stripe.
func (w *ChargePeriodWorker) lookUp(ctx context.Context, job *river.Job[ChargePeriodArgs], claim *ledger.Claim, claimedAt time.Time, actor string, logger *slog.Logger) (*ledger.Claim, bool, error) {
	pis, err := chargePaymentIntents(ctx, w.stripe, claim.Charge)
	if err != nil {
		w.release(ctx, claim, logger)
		return nil, false, err
	}
	o, found := reconcileOutcome(claim.Charge, pis, w.stripe.Livemode())
	if !found {
		if err := w.leaseLeft(ctx, claimedAt); err != nil {
			w.release(ctx, claim, logger)
			return nil, false, err
		}
		next, err := w.ledger.ChargeLookupNone(ctx, claim, actor)
		if err != nil {
			return nil, false, err
		}
		if claim.KeyExpired {
			logger.WarnContext(ctx, "key window passed and no PaymentIntent found; moving to the next key generation",
				slog.Int64("charge_id", next.Charge.ID), slog.Int("key_generation", next.Charge.KeyGeneration))
		}
		if err := w.crash(crashAfterLookup); err != nil {
			return nil, false, err
		}
		return next, false, nil
	}
	charge, err := w.ledger.ChargeRecordOutcome(ctx, claim, o, actor, func(ctx context.Context, tx pgx.Tx) error {
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	// A hold is alerted by the ledger (alert=charge_held).
	logger.InfoContext(ctx, "charge found on Stripe before calling", slog.Int64("charge_id", charge.ID), slog.String("status", string(charge.Status)),
		slog.Any("payment_intents", paymentIntentIDs(pis)), slog.String("reason", o.ErrorMessage))
	if charge.Terminal() || charge.Status == ledger.ChargeHeld || charge.Status == ledger.ChargeProcessing {
		return nil, true, nil
	}
	return nil, true, fmt.Errorf("charge %d found on Stripe, now %s", charge.ID, charge.Status)
}

// recordTimeout bounds the transaction that records an outcome.
const recordTimeout = 30 * time.Second

// leaseLeft returns an error when this run may no longer call Stripe: its
// context is done, or less of its lease is left than one Stripe call plus a
// margin needs (measured on the monotonic clock since the claim).
func (w *ChargePeriodWorker) leaseLeft(ctx context.Context, claimedAt time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if left := w.leaseTTL - time.Since(claimedAt); left < w.stripeTimeout+leaseCallMargin {
		return fmt.Errorf("only %s of the charge lease left, less than a Stripe call needs; retrying", left.Round(time.Millisecond))
	}
	return nil
}

// leaseCallMargin is how much lease must remain after a Stripe call.
const leaseCallMargin = 5 * time.Second

// release gives up a claim after a failure before any Stripe call, so the
// retry need not wait for the lease to expire.
func (w *ChargePeriodWorker) release(ctx context.Context, claim *ledger.Claim, logger *slog.Logger) {
	if err := w.ledger.ChargeRelease(ctx, claim); err != nil {
		logger.WarnContext(ctx, "error releasing charge lease", slog.String("error", err.Error()))
	}
}

// snapshotPaymentMethod stores the Stripe customer's default payment method
// on a charge whose customer has none registered. With no default either,
// the charge goes on without one and Stripe's answer fails it.
func (w *ChargePeriodWorker) snapshotPaymentMethod(ctx context.Context, charge *ledger.Charge) (*ledger.Charge, error) {
	cust, err := w.stripe.CustomerGet(ctx, charge.StripeCustomerID)
	if err != nil {
		o := stripeapi.Classify(nil, err)
		if o.Class == ledger.OutcomeFailed {
			return charge, nil // e.g. no such customer: the create will fail the charge with Stripe's code
		}
		return nil, fmt.Errorf("error looking up default payment method of %s: %w", charge.StripeCustomerID, err)
	}
	if cust.InvoiceSettings == nil || cust.InvoiceSettings.DefaultPaymentMethod == nil || cust.InvoiceSettings.DefaultPaymentMethod.ID == "" {
		return charge, nil
	}
	return w.ledger.ChargeSetPaymentMethod(ctx, charge.ID, cust.InvoiceSettings.DefaultPaymentMethod.ID)
}

// owner names this run uniquely: two runs of the same job attempt (a rescued
// job whose first run still lives) get different owners.
func (w *ChargePeriodWorker) owner(job *river.Job[ChargePeriodArgs]) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s/job-%d/%d/%s", w.host, job.ID, job.Attempt, hex.EncodeToString(b))
}

func jitter(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(mathrand.Int64N(int64(max)))
}

func hostID() string {
	h, err := os.Hostname()
	if err != nil {
		h = "unknown-host"
	}
	return fmt.Sprintf("%s/%d", h, os.Getpid())
}
