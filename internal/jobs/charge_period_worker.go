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
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stripe/stripe-go/v76"

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

// ChargePeriodWorker charges one (customer, period): the money path of
// docs/design.md, steps 1 to 8. Each Stripe call stands alone in its step (1, 3, 5, 7) and
// each ledger write is its own transaction in internal/ledger (2, 4, 6, 8);
// the close and the claim share one (Work lists the steps; each is a
// chargeRun method that takes what the steps before found and returns its
// own result with a step).
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

// Crash points of the charge path, in order, with the step each is in.
const (
	crashAfterClaim      = "after_claim"       // 2: lease committed, Stripe not called
	crashAfterCancel     = "after_cancel"      // 3: a retry canceled the charge's PaymentIntents; the next generation not committed
	crashAfterRetryBegin = "after_retry_begin" // 4: a retry committed the next generation and its attempt; Stripe not called
	crashAfterLookup     = "after_lookup"      // 6: look-up found nothing; key and attempt committed, Stripe not called
	crashAfterStripe     = "after_stripe"      // 7: Stripe answered, outcome not written
	crashBeforeComplete  = "before_complete"   // 8: outcome written in the open transaction, job not completed
)

func (w *ChargePeriodWorker) crash(point string) error {
	if w.crashHook == nil {
		return nil
	}
	return w.crashHook(point)
}

// Timeout bounds one run; see ChargeTimings.
func (w *ChargePeriodWorker) Timeout(*river.Job[ChargePeriodArgs]) time.Duration { return w.jobTimeout }

// Work runs the charge of job's (customer, period) to an outcome: the steps
// of the money path in order until one ends the run, each handing its result
// to the next.
func (w *ChargePeriodWorker) Work(ctx context.Context, job *river.Job[ChargePeriodArgs]) error {
	r := w.newRun(job)

	// 1. Pre-flight (Stripe reads, no ledger write): the Stripe customer's
	// default payment method if the charge will need it, and the charge on
	// Stripe if it was never attempted.
	pre, s := r.preflight(ctx)
	if s.end {
		return s.err
	}
	// 2. Close and claim (ledger, one transaction): close the period, find or
	// create its charge, claim its lease and snapshot the payment method (and
	// mark the key's first use after a look-up that found nothing), committed
	// before any money moves.
	cl, s := r.closeClaim(ctx, pre)
	if s.end {
		return s.err
	}
	// 3. Cancel (Stripe): for a past_due charge whose retry is due, cancel its
	// PaymentIntents that could still succeed, then read the customer's
	// current default payment method for the next attempt.
	cn, s := r.cancel(ctx, cl)
	if s.end {
		return s.err
	}
	// 4. Begin the retry (ledger): settle the charge if a cancel showed it
	// paid, or finish a cancel, or commit the next key generation and its
	// attempt.
	cl, s = r.beginRetry(ctx, cl, cn)
	if s.end {
		return s.err
	}
	// 5. Look up (Stripe): look for the charge's PaymentIntent unless its key
	// is proven fresh (by the claim, after step 1's look-up).
	pis, s := r.lookUp(ctx, cl)
	if s.end {
		return s.err
	}
	// 6. Record the look-up (ledger): a found PaymentIntent's outcome is
	// recorded; nothing found marks the key's first use.
	cl, s = r.recordLookup(ctx, cl, pis)
	if s.end {
		return s.err
	}
	// 7. Call (Stripe): create the PaymentIntent with the charge's
	// idempotency key.
	outcome, s := r.call(ctx, cl)
	if s.end {
		return s.err
	}
	// 8. Record the outcome and complete the River job (ledger, one
	// transaction).
	return r.record(ctx, cl, outcome).err
}

// step is how one step of a charge run ends: go on to the next step, or end
// the run with err — nil when the job is done, river.JobSnooze to run again
// later, any other error for River to retry with backoff.
type step struct {
	end bool
	err error
}

// goOn is the step that hands over to the next one.
var goOn = step{}

// endRun ends the run with err (nil: the job is done).
func endRun(err error) step { return step{end: true, err: err} }

// chargeRun is one run of a charge job: what every step of it knows from the
// start. What a step finds is its result, handed to the next step.
type chargeRun struct {
	w      *ChargePeriodWorker
	job    *river.Job[ChargePeriodArgs]
	actor  string
	logger *slog.Logger
}

func (w *ChargePeriodWorker) newRun(job *river.Job[ChargePeriodArgs]) *chargeRun {
	return &chargeRun{w: w, job: job, actor: fmt.Sprintf("job:%d/%d", job.ID, job.Attempt),
		logger: w.logger.With(slog.String("customer_id", job.Args.CustomerID), slog.String("period", job.Args.Period),
			slog.Int64("job_id", job.ID), slog.Int("job_attempt", job.Attempt))}
}

// preflight is step 1, taken before the close so that the close, the claim
// and the key's first use are one transaction. For a charge that will have
// no payment method (its customer has none registered) and was never
// attempted, it looks up the Stripe customer's default one; the claim
// snapshots it on the charge (ledger.ChargeClaimParams.PaymentMethodID).
// With no default either, the charge goes on without one and Stripe's answer
// fails it. For a charge with no attempt of its key generation on record, it
// makes the charge's look-up (step 5) now: when no PaymentIntent carries the
// charge key, the claim marks the key's first use
// (ledger.ChargeClaimParams.LookedUp); otherwise, or when the listing fails,
// step 5 looks again once the charge is claimed.
func (r *chargeRun) preflight(ctx context.Context) (preflightResult, step) {
	pf, err := r.w.ledger.ChargePreflight(ctx, r.job.Args.CustomerID, r.job.Args.Period)
	if err != nil {
		return preflightResult{}, endRun(err)
	}
	var pre preflightResult
	if t := pf.Lookup; t != nil {
		pis, err := paymentIntentsOf(ctx, r.w.stripe, *t)
		switch {
		case err != nil:
			r.logger.InfoContext(ctx, "look-up before the claim failed; looking again after it", slog.String("error", err.Error()))
		case len(pis) == 0:
			pre.lookedUp = t
		}
	}
	if pf.PaymentMethodOf == "" {
		return pre, goOn
	}
	pm, err := defaultPaymentMethod(ctx, r.w.stripe, pf.PaymentMethodOf)
	if err != nil {
		// The close goes on without it (the claim waits for it): a Stripe
		// outage delays charges, not the close.
		pre.paymentMethodErr = err
		return pre, goOn
	}
	pre.paymentMethodOf, pre.paymentMethodID = pf.PaymentMethodOf, pm
	return pre, goOn
}

// preflightResult is what preflight found on Stripe, for the claim.
type preflightResult struct {
	paymentMethodID  string               // the Stripe customer's default, for the claim to snapshot
	paymentMethodOf  string               // the Stripe customer it was looked up for (paymentMethodID may be empty)
	paymentMethodErr error                // the payment method's look-up failed; the close goes on, the claim waits
	lookedUp         *ledger.LookupTarget // listed on Stripe, no PaymentIntent carries the charge key
}

// defaultPaymentMethod returns the default payment method of Stripe
// customer id ("" when it has none, or when Stripe refuses the look-up for
// good, e.g. no such customer: the create then fails the charge with
// Stripe's code).
func defaultPaymentMethod(ctx context.Context, s Stripe, id string) (string, error) {
	cust, err := s.CustomerGet(ctx, id)
	switch {
	case err != nil && stripeapi.Classify(nil, err).Class == ledger.OutcomeFailed:
		return "", nil
	case err != nil:
		return "", fmt.Errorf("error looking up default payment method of %s: %w", id, err)
	}
	if s := cust.InvoiceSettings; s != nil && s.DefaultPaymentMethod != nil {
		return s.DefaultPaymentMethod.ID, nil
	}
	return "", nil
}

// closeClaim is step 2, in one transaction: close the period, find or create
// its charge and take its lease, committed before any money moves. A charge
// that is terminal, held or processing needs no Stripe call, nor does one
// its guards held or carried forward: the job is done. Another run's live
// lease, or the kill switch, snoozes the job.
func (r *chargeRun) closeClaim(ctx context.Context, pre preflightResult) (claimed, step) {
	cc, err := r.w.ledger.PeriodCloseClaim(ctx, ledger.PeriodCloseClaimParams{
		Close: ledger.PeriodCloseParams{CustomerID: r.job.Args.CustomerID, Period: r.job.Args.Period, Actor: r.actor},
		Claim: ledger.ChargeClaimParams{Owner: r.w.owner(r.job), LeaseTTL: r.w.leaseTTL, JobID: r.job.ID, JobAttempt: r.job.Attempt,
			PaymentMethodID: pre.paymentMethodID, LookedUp: pre.lookedUp},
		PaymentMethodOf: pre.paymentMethodOf,
	})
	var held *ledger.LeaseHeldError
	switch {
	case errors.As(err, &held):
		wait := max(held.Left, time.Second) + jitter(time.Second)
		r.logger.InfoContext(ctx, "charge leased by another run; snoozing", slog.String("lease_owner", held.Owner), slog.Duration("snooze", wait))
		return claimed{}, endRun(river.JobSnooze(wait))
	case errors.Is(err, ledger.ErrChargingPaused):
		return claimed{}, r.pausedSnooze(ctx)
	case err != nil:
		return claimed{}, endRun(err)
	case cc.NeedsPaymentMethod && pre.paymentMethodErr != nil:
		return claimed{}, endRun(pre.paymentMethodErr) // River retries with backoff; the period is closed
	case cc.NeedsPaymentMethod:
		// The customer's payment method or Stripe customer changed since
		// step 1 read them.
		r.logger.InfoContext(ctx, "charge needs its payment method looked up; snoozing", slog.Int64("charge_id", cc.Charge.ID))
		return claimed{}, endRun(river.JobSnooze(time.Second))
	case cc.Claim == nil:
		// Settled, held or carried forward; a hold is alerted by the ledger.
		r.logger.InfoContext(ctx, "charge needs no stripe call", slog.Int64("charge_id", cc.Charge.ID), slog.String("status", string(cc.Charge.Status)))
		return claimed{}, endRun(nil)
	}
	return claimed{claim: cc.Claim, at: time.Now()}, r.crashAt(crashAfterClaim)
}

// claimed is the charge's lease as this run holds it: the claim, as the last
// ledger write left it, and when it was taken.
type claimed struct {
	claim *ledger.Claim
	at    time.Time // on the monotonic clock: how long the run has held the lease
}

// cancel is step 3, for a past_due charge whose retry is due (dunning; the
// claim's Retry). It lists the charge's PaymentIntents on Stripe and cancels
// each one that could still succeed, so that none of them ever does; one
// that succeeded or is processing after all is moved, and beginRetry makes
// it the charge's outcome. Unless one moved or an operator asked to cancel
// the charge, it then reads the Stripe customer's current default payment
// method for the next attempt. A crash anywhere here leaves the charge
// past_due and due: the next run lists again.
func (r *chargeRun) cancel(ctx context.Context, cl claimed) (canceled, step) {
	if !cl.claim.Retry {
		return canceled{}, goOn
	}
	c := cl.claim.Charge
	pis, err := chargePaymentIntents(ctx, r.w.stripe, c)
	if err != nil {
		return canceled{}, r.release(ctx, cl, err)
	}
	if own := c.StripePaymentIntentID; own != nil && !slices.ContainsFunc(pis, func(pi *stripe.PaymentIntent) bool { return pi.ID == *own }) {
		// The one the ledger names, although the listing missed it.
		pi, err := r.w.stripe.PaymentIntentGet(ctx, *own)
		if err != nil {
			return canceled{}, r.release(ctx, cl, fmt.Errorf("error reading PaymentIntent %s before a retry: %w", *own, err))
		}
		pis = append(pis, pi)
	}
	var cn canceled
	for _, pi := range pis {
		if pi.Status != stripe.PaymentIntentStatusCanceled && !paymentIntentMoved(pi) {
			if err := r.w.leaseLeft(ctx, cl.at); err != nil {
				return canceled{}, r.release(ctx, cl, err)
			}
			if pi, err = r.cancelPaymentIntent(ctx, pi.ID); err != nil {
				return canceled{}, r.release(ctx, cl, err)
			}
		}
		switch {
		case pi.Status == stripe.PaymentIntentStatusCanceled:
			cn.retired = append(cn.retired, pi.ID)
		case paymentIntentMoved(pi):
			cn.moved = append(cn.moved, pi)
		default:
			return canceled{}, r.release(ctx, cl, fmt.Errorf("PaymentIntent %s of charge %d is %s after its cancel; retrying", pi.ID, c.ID, pi.Status))
		}
	}
	if len(cn.moved) > 0 {
		return cn, goOn // paid after all: no next attempt
	}
	if s := r.crashAt(crashAfterCancel); s.end {
		return canceled{}, s
	}
	if c.CancelRequestedAt != nil {
		return cn, goOn // an operator's cancel: no next attempt
	}
	if cn.paymentMethodID, err = defaultPaymentMethod(ctx, r.w.stripe, c.StripeCustomerID); err != nil {
		return canceled{}, r.release(ctx, cl, err)
	}
	return cn, goOn
}

// canceled is what cancel left of a charge's PaymentIntents on Stripe.
type canceled struct {
	retired         []string                // canceled, now or before
	moved           []*stripe.PaymentIntent // succeeded or processing: none was canceled in time
	paymentMethodID string                  // the Stripe customer's default, for the next attempt
}

// beginRetry is step 4, the ledger's half of a retry, after cancel. A
// PaymentIntent that moved is the charge's outcome (two are a double charge:
// held). An operator's cancel of the charge is then carried out
// (ledger.ChargeCancelFinish). Otherwise ledger.ChargeRetryBegin commits the
// next key generation, the customer's current payment method and the
// attempt row, and the call goes on with the new key.
func (r *chargeRun) beginRetry(ctx context.Context, cl claimed, cn canceled) (claimed, step) {
	if !cl.claim.Retry {
		return cl, goOn
	}
	c := cl.claim.Charge
	if len(cn.moved) > 0 {
		// The canceled ones are retired first: one the charge names
		// (a ledger restored from before its retry) is no charge.
		o, _ := reconcileOutcome(c, cn.moved, r.w.stripe.Livemode())
		settled, err := r.w.ledger.ChargeRecordRetryPaid(ctx, cl.claim, cn.retired, o, r.actor, r.completeJob)
		if err != nil {
			return claimed{}, endRun(err)
		}
		level, msg := slog.LevelInfo, "past_due charge paid on Stripe before its retry"
		if c.CancelRequestedAt != nil {
			level, msg = slog.LevelWarn, "past_due charge paid on Stripe before its cancel: not canceled"
		}
		r.logger.Log(ctx, level, msg, slog.Int64("charge_id", c.ID),
			slog.String("status", string(settled.Status)), slog.Any("payment_intents", paymentIntentIDs(cn.moved)))
		return claimed{}, endRun(nil)
	}
	if c.CancelRequestedAt != nil {
		// An operator's cancel: none of the charge's PaymentIntents can
		// succeed any more, so the charge is canceled and the job is done.
		done, err := r.w.ledger.ChargeCancelFinish(ctx, cl.claim, cn.retired, r.completeJob)
		if err != nil {
			return claimed{}, r.release(ctx, cl, err)
		}
		r.logger.WarnContext(ctx, "past_due charge canceled by an operator", slog.Int64("charge_id", done.ID),
			slog.String("actor", *done.CancelRequestedBy), slog.Any("canceled_payment_intents", cn.retired))
		return claimed{}, endRun(nil)
	}
	if err := r.w.leaseLeft(ctx, cl.at); err != nil {
		return claimed{}, r.release(ctx, cl, err)
	}
	next, err := r.w.ledger.ChargeRetryBegin(ctx, cl.claim, ledger.ChargeRetryBeginParams{
		Retired: cn.retired, DefaultPaymentMethodID: cn.paymentMethodID, Actor: r.actor})
	if errors.Is(err, ledger.ErrChargingPaused) {
		r.release(ctx, cl, nil)
		return claimed{}, r.pausedSnooze(ctx)
	}
	if err != nil {
		return claimed{}, r.release(ctx, cl, err)
	}
	r.logger.InfoContext(ctx, "retrying past_due charge", slog.Int64("charge_id", c.ID), slog.Int("dunning_retry", next.Charge.DunningRetries),
		slog.Int("key_generation", next.Charge.KeyGeneration), slog.Any("canceled_payment_intents", cn.retired))
	return claimed{claim: next, at: cl.at}, r.crashAt(crashAfterRetryBegin)
}

// cancelPaymentIntent cancels PaymentIntent id on Stripe and returns it as it
// is after: canceled, or what it became if it could no longer be canceled
// (succeeded, processing, canceled before).
func (r *chargeRun) cancelPaymentIntent(ctx context.Context, id string) (*stripe.PaymentIntent, error) {
	pi, err := r.w.stripe.PaymentIntentCancel(ctx, id)
	if err == nil {
		return pi, nil
	}
	got, gerr := r.w.stripe.PaymentIntentGet(ctx, id)
	if gerr != nil {
		return nil, fmt.Errorf("error canceling PaymentIntent %s before a retry: %w (and reading it: %w)", id, err, gerr)
	}
	return got, nil
}

// lookUp is step 5. Tally's own record can be lost (a restored backup, a
// failover that drops the last commits) and Stripe forgets a key after 24 h,
// so unless this database holds an attempt of the key's generation within
// the key window (ledger.Claim.Lookup), it lists the charge's PaymentIntents
// on Stripe before any call, for recordLookup.
func (r *chargeRun) lookUp(ctx context.Context, cl claimed) ([]*stripe.PaymentIntent, step) {
	if !cl.claim.Lookup {
		return nil, goOn
	}
	pis, err := chargePaymentIntents(ctx, r.w.stripe, cl.claim.Charge)
	if err != nil {
		return nil, r.release(ctx, cl, err)
	}
	return pis, goOn
}

// recordLookup is step 6, after lookUp found pis. One found → the charge
// takes its outcome and the job completes; several, or one that differs from
// the charge → held; none → ledger.ChargeLookupNone commits the key to call
// with (the next generation when the key expired) and the attempt row.
func (r *chargeRun) recordLookup(ctx context.Context, cl claimed, pis []*stripe.PaymentIntent) (claimed, step) {
	if !cl.claim.Lookup {
		return cl, goOn
	}
	o, found := reconcileOutcome(cl.claim.Charge, pis, r.w.stripe.Livemode())
	if found {
		c, err := r.w.ledger.ChargeRecordOutcome(ctx, cl.claim, o, r.actor, r.completeJob)
		if err != nil {
			return claimed{}, endRun(err)
		}
		// A hold is alerted by the ledger (alert=charge_held).
		r.logger.InfoContext(ctx, "charge found on Stripe before calling", slog.Int64("charge_id", c.ID), slog.String("status", string(c.Status)),
			slog.Any("payment_intents", paymentIntentIDs(pis)), slog.String("reason", o.ErrorMessage))
		if c.Terminal() || c.Status == ledger.ChargeHeld || c.Status == ledger.ChargeProcessing || c.Status == ledger.ChargePastDue {
			return claimed{}, endRun(nil)
		}
		return claimed{}, endRun(fmt.Errorf("charge %d found on Stripe, now %s", c.ID, c.Status))
	}
	if err := r.w.leaseLeft(ctx, cl.at); err != nil {
		return claimed{}, r.release(ctx, cl, err)
	}
	next, err := r.w.ledger.ChargeLookupNone(ctx, cl.claim, r.actor)
	if err != nil {
		return claimed{}, endRun(err)
	}
	if cl.claim.KeyExpired {
		r.logger.WarnContext(ctx, "key window passed and no PaymentIntent found; moving to the next key generation",
			slog.Int64("charge_id", next.Charge.ID), slog.Int("key_generation", next.Charge.KeyGeneration))
	}
	return claimed{claim: next, at: cl.at}, r.crashAt(crashAfterLookup)
}

// call is step 7: create the PaymentIntent. Parameters and key are a pure
// function of the charge row. A run that stalled (GC, a paused VM) must not
// call once its lease may have passed to another run, which may already have
// moved on.
func (r *chargeRun) call(ctx context.Context, cl claimed) (ledger.Outcome, step) {
	if err := r.w.leaseLeft(ctx, cl.at); err != nil {
		return ledger.Outcome{}, r.release(ctx, cl, err)
	}
	pi, err := r.w.stripe.PaymentIntentCreate(ctx, stripeapi.PaymentIntentParams(cl.claim.Charge))
	return stripeapi.Classify(pi, err), r.crashAt(crashAfterStripe)
}

// record is step 8: record the outcome and, when the job's work is done,
// complete the job in the same transaction. The answer is recorded even if
// the job's deadline passed meanwhile. The outcome's class then says how the
// job goes on (afterOutcome).
func (r *chargeRun) record(ctx context.Context, cl claimed, o ledger.Outcome) step {
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	c, err := r.w.ledger.ChargeRecordOutcome(recordCtx, cl.claim, o, r.actor, func(ctx context.Context, tx *ledger.Tx) error {
		if err := r.w.crash(crashBeforeComplete); err != nil {
			return err
		}
		return r.completeJob(ctx, tx)
	})
	if err != nil {
		return endRun(err)
	}
	next := r.afterOutcome(c, o)
	level, msg := outcomeLog(o.Class)
	attrs := []any{slog.Int64("charge_id", c.ID), slog.String("outcome", string(o.Class)),
		slog.String("status", string(c.Status)), slog.String("payment_intent", o.StripePaymentIntentID),
		slog.String("stripe_request_id", o.StripeRequestID), slog.Int("http_status", o.HTTPStatus),
		slog.String("error_code", o.ErrorCode)}
	if next != nil {
		attrs = append(attrs, slog.String("then", next.Error()))
	}
	r.logger.Log(ctx, level, msg, attrs...)
	return endRun(next)
}

// afterOutcome is how the job goes on once outcome o of its call is recorded
// on charge c: an unknown outcome or a refused request is retried by River
// with backoff (an error; the same key), a "not now" (429, key in use) is
// snoozed with jitter, and every other class is done.
func (r *chargeRun) afterOutcome(c *ledger.Charge, o ledger.Outcome) error {
	switch o.Class {
	case ledger.OutcomeUnknown:
		return fmt.Errorf("charge %d outcome unknown (%s %s): %s", c.ID, o.ErrorType, o.ErrorCode, o.ErrorMessage)
	case ledger.OutcomeError:
		return fmt.Errorf("charge %d refused by stripe (%d %s): %s", c.ID, o.HTTPStatus, o.ErrorCode, o.ErrorMessage)
	case ledger.OutcomeRetryLater:
		return river.JobSnooze(r.w.retryLaterMin + jitter(r.w.retryLaterMax-r.w.retryLaterMin))
	}
	return nil
}

// outcomeLog is how a recorded outcome is logged, by class. A hold is
// alerted by the ledger itself (alert=charge_held).
func outcomeLog(class ledger.OutcomeClass) (slog.Level, string) {
	switch class {
	case ledger.OutcomeUnknown:
		return slog.LevelWarn, "charge outcome unknown; retrying with the same key"
	case ledger.OutcomeError:
		return slog.LevelError, "stripe refused the request; retrying with backoff"
	case ledger.OutcomeRetryLater:
		return slog.LevelInfo, "stripe asked to retry later; snoozing"
	}
	return slog.LevelInfo, "charge attempted"
}

// completeJob completes the run's River job in tx, the transaction that
// records the outcome, as its last statement. River's completion statement
// (JobSetStateIfRunningMany) would be planned afresh on every run: for the
// one-element arrays it is given, the planner always finds a custom plan
// cheaper than the generic one, although both are the same primary-key
// lookup, and its planning cost Postgres more than any other statement of
// the charge (docs/benchmarks.md, "Figures behind the code's choices"). So
// the rest of tx uses the cached generic plan.
func (r *chargeRun) completeJob(ctx context.Context, tx *ledger.Tx) error {
	tx.ExecLater(`SET LOCAL plan_cache_mode = force_generic_plan`) // sent with the completion
	_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, pgx.Tx(tx), r.job)
	return err
}

// release gives up the lease after a failure before any Stripe call, so the
// retry need not wait for it to expire, and ends the run with err.
func (r *chargeRun) release(ctx context.Context, cl claimed, err error) step {
	if rerr := r.w.ledger.ChargeRelease(ctx, cl.claim); rerr != nil {
		r.logger.WarnContext(ctx, "error releasing charge lease", slog.String("error", rerr.Error()))
	}
	return endRun(err)
}

// pausedSnooze ends the run of a charge the kill switch refused
// (ledger.ErrChargingPaused) with a snooze.
func (r *chargeRun) pausedSnooze(ctx context.Context) step {
	r.logger.InfoContext(ctx, "charging is paused (kill switch); snoozing", slog.Duration("snooze", chargingPausedSnooze))
	return endRun(river.JobSnooze(chargingPausedSnooze))
}

// crashAt stops the run at crash point (tests only), leaving its lease and
// attempt row as they are, as if the process died there.
func (r *chargeRun) crashAt(point string) step {
	if err := r.w.crash(point); err != nil {
		return endRun(err)
	}
	return goOn
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
