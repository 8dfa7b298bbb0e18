package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ErrLeaseLost is returned by ChargeRecordOutcome when the caller no longer
// holds the charge's lease: another run took over and will record the same
// Stripe result, which the shared idempotency key guarantees.
var ErrLeaseLost = errors.New("charge lease lost")

// ChargeRecordOutcome is step 8 of the money path. In one transaction it
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
func (l *Ledger) ChargeRecordOutcome(ctx context.Context, claim *Claim, o Outcome, actor string, done func(ctx context.Context, tx *Tx) error) (*Charge, error) {
	return l.chargeRecordOutcome(ctx, claim, nil, o, actor, done)
}

// ChargeRecordRetryPaid is ChargeRecordOutcome for a past_due charge whose
// retry (Claim.Retry) found, listing its PaymentIntents on Stripe, that one
// moved money after all (o is its outcome) while the others are canceled
// (retired). In the same transaction it first records the retired ones as
// the charge's (Charge.RetiredPaymentIntentIDs), and when the charge names
// one of them, names none: a canceled PaymentIntent is not a charge. So a
// ledger restored from before a retry that Stripe saw succeed (the first
// PaymentIntent canceled, the retry's succeeded) takes the retry's
// PaymentIntent instead of holding a double charge.
func (l *Ledger) ChargeRecordRetryPaid(ctx context.Context, claim *Claim, retired []string, o Outcome, actor string, done func(ctx context.Context, tx *Tx) error) (*Charge, error) {
	return l.chargeRecordOutcome(ctx, claim, retired, o, actor, done)
}

func (l *Ledger) chargeRecordOutcome(ctx context.Context, claim *Claim, retired []string, o Outcome, actor string, done func(ctx context.Context, tx *Tx) error) (*Charge, error) {
	var charge, before *Charge
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		c, err := chargeLockTx(ctx, tx, claim.Charge.ID)
		if err != nil {
			return err
		}
		before = c
		if !claim.holds(c) {
			return ErrLeaseLost
		}

		if claim.AttemptID != 0 {
			attemptFinishTx(tx, now, claim.AttemptID, o)
		}
		if c, err = chargeRetireTx(ctx, tx, now, c, retired, actor); err != nil {
			return err
		}

		applied, err := l.chargeApplyOutcomeTx(ctx, tx, now, c, o, actor, outcomeFromClaimant)
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

// chargeRetireTx records PaymentIntents retired (canceled on Stripe: none
// of them can move money any more) on the locked charge c, which then names
// none of them, and logs it as a transition (status unchanged). Nothing
// new to retire changes nothing.
func chargeRetireTx(ctx context.Context, tx *Tx, now time.Time, c *Charge, retired []string, actor string) (*Charge, error) {
	var add []string
	for _, pi := range retired {
		if !c.Retired(pi) && !slices.Contains(add, pi) {
			add = append(add, pi)
		}
	}
	if len(add) == 0 {
		return c, nil
	}
	updated, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET retired_payment_intent_ids = retired_payment_intent_ids || $2::text[],
    stripe_payment_intent_id = CASE WHEN stripe_payment_intent_id = ANY($2) THEN NULL ELSE stripe_payment_intent_id END,
    stripe_charge_id = CASE WHEN stripe_payment_intent_id = ANY($2) THEN NULL ELSE stripe_charge_id END,
    updated_at = $3
WHERE id = $1 RETURNING `+chargeColumns, c.ID, add, now))
	if err != nil {
		return nil, fmt.Errorf("error retiring PaymentIntents: %w", err)
	}
	if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, c.Status, actor,
		"canceled on Stripe, retired: "+strings.Join(add, ", ")); err != nil {
		return nil, err
	}
	return updated, nil
}

// holds reports whether c, read under its lock, is still leased by claim.
func (claim *Claim) holds(c *Charge) bool {
	return c.LeaseOwner != nil && *c.LeaseOwner == claim.Owner
}
