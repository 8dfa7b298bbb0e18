package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripeapi"
)

// TopUpArgs are the args of the job of one top-up, unique by both fields.
type TopUpArgs struct {
	CustomerID string `json:"customer_id" river:"unique"`
	TopUpID    string `json:"top_up_id" river:"unique"`
}

// Kind is the River job kind, "top_up".
func (TopUpArgs) Kind() string { return "top_up" }

// InsertOpts puts top-up jobs on QueueCharges: they move money, so the kill
// switch (the queue's pause) stops them too.
func (TopUpArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueCharges, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// topUpLookback is how long before a top-up's row the look-up for its
// PaymentIntents starts: beyond clock skew, a top-up bought again under its
// top_up_id after a restore lost its row must find the PaymentIntent of the
// first purchase, days before the new row.
const topUpLookback = 30 * 24 * time.Hour

// topUpPollInterval is how often the job of a processing top-up looks at
// its PaymentIntent again (a webhook usually settles it first).
const topUpPollInterval = 5 * time.Minute

// Crash points of the top-up path (tests only).
const (
	crashTopUpAfterClaim     = "top_up_after_claim"     // lease committed, Stripe not called
	crashTopUpAfterStripe    = "top_up_after_stripe"    // Stripe answered, outcome not written
	crashTopUpBeforeComplete = "top_up_before_complete" // outcome (and grant) written in the open transaction, not committed
)

// TopUpWorker buys a top-up's credits: the money path of a charge, shorter.
//
//  1. Claim (ledger): lease the top-up, committed before any money moves;
//     the customer's cap holds one never attempted, the kill switch snoozes.
//  2. Look up (Stripe): list the customer's PaymentIntents carrying the
//     top-up's key — before every call, so a lost record (a crash after the
//     call, a restore) never calls twice.
//  3. Call (Stripe), if the look-up found none: create the PaymentIntent
//     with the top-up's key.
//  4. Record (ledger, one transaction): the outcome, the grant when it
//     succeeded, and the job's completion when the top-up is settled.
type TopUpWorker struct {
	river.WorkerDefaults[TopUpArgs]

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

// Timeout bounds one run; see ChargeTimings.
func (w *TopUpWorker) Timeout(*river.Job[TopUpArgs]) time.Duration { return w.jobTimeout }

func (w *TopUpWorker) crash(point string) error {
	if w.crashHook == nil {
		return nil
	}
	return w.crashHook(point)
}

// Work runs the top-up to an outcome.
func (w *TopUpWorker) Work(ctx context.Context, job *river.Job[TopUpArgs]) error {
	args := job.Args
	actor := fmt.Sprintf("job:%d/%d", job.ID, job.Attempt)
	logger := w.logger.With(slog.String("customer_id", args.CustomerID), slog.String("top_up_id", args.TopUpID),
		slog.Int64("job_id", job.ID), slog.Int("job_attempt", job.Attempt))
	t, err := w.ledger.TopUpGet(ctx, args.CustomerID, args.TopUpID)
	if err != nil {
		return err
	}
	if t.Status.Terminal() || t.Status == ledger.TopUpHeld {
		return nil
	}
	var pm string
	if t.StripePaymentMethodID == nil && t.FirstAttemptedAt == nil {
		// The customer has none registered: the Stripe customer's default,
		// snapshotted by the claim before the first call.
		if pm, err = defaultPaymentMethod(ctx, w.stripe, t.StripeCustomerID); err != nil {
			return err
		}
	}

	// 1. Claim.
	claim, err := w.ledger.TopUpClaim(ctx, ledger.TopUpClaimParams{CustomerID: args.CustomerID, TopUpID: args.TopUpID,
		Owner: w.owner(job), LeaseTTL: w.leaseTTL, PaymentMethodID: pm, Actor: actor})
	var held *ledger.LeaseHeldError
	switch {
	case errors.As(err, &held):
		wait := max(held.Left, time.Second) + jitter(time.Second)
		logger.InfoContext(ctx, "top-up leased by another run; snoozing", slog.String("lease_owner", held.Owner), slog.Duration("snooze", wait))
		return river.JobSnooze(wait)
	case errors.Is(err, ledger.ErrChargingPaused):
		logger.InfoContext(ctx, "charging is paused (kill switch); snoozing", slog.Duration("snooze", chargingPausedSnooze))
		return river.JobSnooze(chargingPausedSnooze)
	case err != nil:
		return err
	case claim == nil:
		return nil // settled or held meanwhile; a hold is alerted by the ledger
	}
	claimedAt := time.Now()
	if err := w.crash(crashTopUpAfterClaim); err != nil {
		return err
	}

	// 2. Look up.
	pis, err := topUpPaymentIntents(ctx, w.stripe, claim.TopUp)
	if err != nil {
		return w.release(ctx, claim, logger, err)
	}
	if o, found := topUpLookupOutcome(claim.TopUp, pis, w.stripe.Livemode()); found {
		return w.record(ctx, job, claim, o, actor, logger)
	}
	if claim.TopUp.Status == ledger.TopUpProcessing {
		return w.release(ctx, claim, logger, fmt.Errorf("top-up %d is processing but Stripe lists no PaymentIntent of it; looking again",
			claim.TopUp.ID))
	}

	// 3. Call, unless the lease may have passed to another run.
	if left := w.leaseTTL - time.Since(claimedAt); left < w.stripeTimeout+leaseCallMargin || ctx.Err() != nil {
		return w.release(ctx, claim, logger, fmt.Errorf("only %s of the top-up lease left, less than a Stripe call needs; retrying",
			left.Round(time.Millisecond)))
	}
	pi, err := w.stripe.PaymentIntentCreate(ctx, stripeapi.TopUpPaymentIntentParams(claim.TopUp))
	o := stripeapi.Classify(pi, err)
	if err := w.crash(crashTopUpAfterStripe); err != nil {
		return err
	}

	// 4. Record.
	return w.record(ctx, job, claim, o, actor, logger)
}

// record writes outcome o and, when the top-up is settled, completes the
// job in the same transaction; then says how the job goes on.
func (w *TopUpWorker) record(ctx context.Context, job *river.Job[TopUpArgs], claim *ledger.TopUpClaim, o ledger.Outcome,
	actor string, logger *slog.Logger) error {
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	t, err := w.ledger.TopUpRecordOutcome(recordCtx, claim, o, actor, func(ctx context.Context, tx *ledger.Tx) error {
		if err := w.crash(crashTopUpBeforeComplete); err != nil {
			return err
		}
		tx.ExecLater(`SET LOCAL plan_cache_mode = force_generic_plan`)
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, pgx.Tx(tx), job)
		return err
	})
	if err != nil {
		return err
	}
	logger.InfoContext(ctx, "top-up attempted", slog.String("outcome", string(o.Class)), slog.String("status", string(t.Status)),
		slog.String("payment_intent", o.StripePaymentIntentID), slog.Int("http_status", o.HTTPStatus),
		slog.String("error_code", o.ErrorCode))
	switch {
	case t.Status == ledger.TopUpProcessing:
		return river.JobSnooze(topUpPollInterval)
	case o.Class == ledger.OutcomeRetryLater && !t.Status.Terminal():
		return river.JobSnooze(w.retryLaterMin + jitter(w.retryLaterMax-w.retryLaterMin))
	case t.Status == ledger.TopUpPending || t.Status == ledger.TopUpUnknown:
		// An unknown answer or a refused request: River retries with
		// backoff, and the next run looks before it calls again.
		return fmt.Errorf("top-up %d outcome %s (%d %s): %s", t.ID, o.Class, o.HTTPStatus, o.ErrorCode, o.ErrorMessage)
	}
	return nil
}

// release gives up the lease after a failure before any Stripe call, and
// returns err.
func (w *TopUpWorker) release(ctx context.Context, claim *ledger.TopUpClaim, logger *slog.Logger, err error) error {
	if rerr := w.ledger.TopUpRelease(ctx, claim); rerr != nil {
		logger.WarnContext(ctx, "error releasing top-up lease", slog.String("error", rerr.Error()))
	}
	return err
}

func (w *TopUpWorker) owner(job *river.Job[TopUpArgs]) string {
	return fmt.Sprintf("%s/top-up-job-%d/%d/%d", w.host, job.ID, job.Attempt, time.Now().UnixNano())
}

// topUpPaymentIntents lists the PaymentIntents on Stripe that carry top-up
// t's key (metadata.tally_top_up_key), created since topUpLookback before
// the top-up, and the one the ledger names if the listing missed it.
func topUpPaymentIntents(ctx context.Context, s Stripe, t *ledger.TopUp) ([]*stripe.PaymentIntent, error) {
	all, err := s.PaymentIntentList(ctx, t.StripeCustomerID, t.CreatedAt.Add(-topUpLookback))
	if err != nil {
		return nil, err
	}
	var mine []*stripe.PaymentIntent
	for _, pi := range all {
		if pi.Metadata["tally_top_up_key"] == t.Key {
			mine = append(mine, pi)
		}
	}
	if own := t.StripePaymentIntentID; own != nil && len(mine) == 0 {
		pi, err := s.PaymentIntentGet(ctx, *own)
		if err != nil {
			return nil, fmt.Errorf("error reading PaymentIntent %s of top-up %d: %w", *own, t.ID, err)
		}
		mine = append(mine, pi)
	}
	return mine, nil
}

// topUpLookupOutcome says what a top-up's PaymentIntents on Stripe mean: one
// that is really its own → its outcome; one that differs → held
// payment_intent_mismatch; several → held double_charge (one key cannot
// make two, so a human must look). found is false when there is none.
func topUpLookupOutcome(t *ledger.TopUp, pis []*stripe.PaymentIntent, livemode bool) (ledger.Outcome, bool) {
	switch len(pis) {
	case 0:
		return ledger.Outcome{}, false
	case 1:
		pi := pis[0]
		if why := t.PaymentIntentMismatch(topUpPaymentIntentFacts(pi), livemode); why != "" {
			return ledger.Outcome{Class: ledger.OutcomeHeld, HeldReason: ledger.HeldPaymentIntentMismatch, ErrorMessage: why,
				StripePaymentIntentID: pi.ID, ResolvedBy: "lookup"}, true
		}
		o := stripeapi.OutcomeOf(pi)
		o.ResolvedBy = "lookup"
		return o, true
	}
	return ledger.Outcome{Class: ledger.OutcomeHeld, HeldReason: ledger.HeldDoubleCharge,
		ErrorMessage: fmt.Sprintf("%d PaymentIntents carry the top-up's key: %v", len(pis), paymentIntentIDs(pis)),
		ResolvedBy:   "lookup"}, true
}

// topUpPaymentIntentFacts is what the ledger checks of a top-up's
// PaymentIntent: its key is metadata.tally_top_up_key.
func topUpPaymentIntentFacts(pi *stripe.PaymentIntent) ledger.PaymentIntentFacts {
	f := paymentIntentFacts(pi)
	f.ChargeKey = pi.Metadata["tally_top_up_key"]
	return f
}
