package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrLeaseLost is returned by ChargeRecordOutcome when the caller no longer
// holds the charge's lease: another run took over and will record the same
// Stripe result, which the shared idempotency key guarantees.
var ErrLeaseLost = errors.New("charge lease lost")

// ChargeRecordOutcome is step 5 of the money path. In one transaction it
// finishes the claim's attempt row (when it has one), moves the charge by the
// outcome's class (succeeded, processing, failed, unknown, held; retry_later
// and error keep its status), releases the lease, logs the transition with
// actor, and, when the job's work is done (every class but unknown,
// retry_later and error), runs done in the same transaction — the worker
// completes its River job there, so the outcome and the job's completion
// commit together.
//
// When a webhook or the reconciler settled the charge while the claimant was
// calling Stripe, the charge keeps that status (transitions are monotonic);
// the attempt is still recorded and done still runs.
//
// It returns ErrLeaseLost, writing nothing, when claim's lease was taken
// over.
func (l *Ledger) ChargeRecordOutcome(ctx context.Context, claim *Claim, o Outcome, actor string, done func(ctx context.Context, tx pgx.Tx) error) (*Charge, error) {
	var charge, before *Charge
	err := l.withTx(ctx, func(tx pgx.Tx) error {
		now := l.now()
		c, err := chargeLockTx(ctx, tx, claim.Charge.ID)
		if err != nil {
			return err
		}
		before = c
		if c.LeaseOwner == nil || *c.LeaseOwner != claim.Owner {
			return ErrLeaseLost
		}

		if claim.AttemptID != 0 {
			if err := attemptFinishTx(ctx, tx, now, claim.AttemptID, o); err != nil {
				return err
			}
		}

		applied, err := l.chargeApplyOutcomeTx(ctx, tx, now, c, o, actor, true)
		if err != nil {
			return fmt.Errorf("error applying outcome: %w", err)
		}
		charge = applied.Charge
		switch o.Class {
		case OutcomeUnknown, OutcomeRetryLater, OutcomeError:
			if !charge.Terminal() {
				return nil
			}
		}
		if done != nil {
			return done(ctx, tx)
		}
		return nil
	})
	if errors.Is(err, ErrLeaseLost) {
		return nil, ErrLeaseLost
	}
	if err != nil {
		return nil, fmt.Errorf("error recording outcome of charge %d: %w", claim.Charge.ID, err)
	}
	l.alertIfHeld(ctx, before.Status, charge, actor)
	return charge, nil
}
