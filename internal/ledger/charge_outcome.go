package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Outcome is what one Stripe call returned, as the ledger records it.
type Outcome struct {
	Class                 OutcomeClass
	StripePaymentIntentID string
	StripeChargeID        string
	HTTPStatus            int
	StripeRequestID       string
	ErrorType             string
	ErrorCode             string
	ErrorMessage          string

	// ResolvedBy says what decided a final outcome: stripe_response (the
	// default), reconcile, webhook:<event id>.
	ResolvedBy string

	// HeldReason is why an OutcomeHeld holds the charge. Default
	// HeldUnexpectedStatus.
	HeldReason HeldReason
}

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
		c, err := scanCharge(tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges WHERE id = $1 FOR UPDATE`, claim.Charge.ID))
		if err != nil {
			return fmt.Errorf("error locking charge: %w", err)
		}
		before = c
		if c.LeaseOwner == nil || *c.LeaseOwner != claim.Owner {
			return ErrLeaseLost
		}

		if claim.AttemptID != 0 {
			tag, err := tx.Exec(ctx, `
UPDATE billing.charge_attempts
SET finished_at = $2, outcome = $3, http_status = $4, stripe_request_id = $5,
    stripe_payment_intent_id = $6, error_type = $7, error_code = $8, error_message = $9
WHERE id = $1 AND finished_at IS NULL`, claim.AttemptID, now, o.Class, nullInt(o.HTTPStatus),
				nullString(o.StripeRequestID), nullString(o.StripePaymentIntentID), nullString(o.ErrorType),
				nullString(o.ErrorCode), nullString(o.ErrorMessage))
			if err != nil {
				return fmt.Errorf("error finishing attempt: %w", err)
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("attempt %d is already finished", claim.AttemptID)
			}
		}

		charge, _, _, err = l.chargeTakeOutcomeTx(ctx, tx, now, c, o, actor, true)
		if err != nil {
			return fmt.Errorf("error applying outcome: %w", err)
		}
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

// chargeMayTake reports whether charge c may take an outcome o; transitions
// are monotonic. Pending and unknown take any outcome; processing only a
// final one. A failed or held charge takes only a success of the PaymentIntent
// it names (or, held, of the first one Stripe reports): Stripe says the money
// moved, so the ledger must too — except where the hold itself is about a
// conflicting PaymentIntent (a double charge, a mismatch), which stays for a
// human. Succeeded, skipped and canceled never change.
func chargeMayTake(c *Charge, o Outcome) bool {
	switch c.Status {
	case ChargePending, ChargeUnknown:
		return true
	case ChargeProcessing:
		return o.Class == OutcomeSucceeded || o.Class == OutcomeFailed || o.Class == OutcomeHeld
	case ChargeFailed:
		return o.Class == OutcomeSucceeded && c.StripePaymentIntentID != nil && *c.StripePaymentIntentID == o.StripePaymentIntentID
	case ChargeHeld:
		return o.Class == OutcomeSucceeded && o.StripePaymentIntentID != "" &&
			(c.HeldReason == nil || !c.HeldReason.Conflicting())
	}
	return false
}

// chargeTakeOutcomeTx applies outcome o to the locked charge c when it may
// take it, and reports whether its status changed. A PaymentIntent other than
// the one c names is never recorded over it: it is a double charge, which
// holds an unsettled charge and, on a settled one, is logged as an ALERT
// transition (status unchanged) for a human. releaseLease also clears the
// lease, whatever happens.
func (l *Ledger) chargeTakeOutcomeTx(ctx context.Context, tx pgx.Tx, now time.Time, c *Charge, o Outcome, actor string, releaseLease bool) (*Charge, bool, *DoubleChargeError, error) {
	if pi := o.StripePaymentIntentID; pi != "" && c.StripePaymentIntentID != nil && *c.StripePaymentIntentID != pi {
		double := &DoubleChargeError{ChargeID: c.ID, PaymentIntents: []string{*c.StripePaymentIntentID, pi}}
		l.logger.ErrorContext(ctx, double.Error(), "actor", actor, "outcome", string(o.Class))
		if (o.Class == OutcomeSucceeded || o.Class == OutcomeProcessing) && !c.Terminal() && c.Status != ChargeHeld {
			held, err := chargeApplyOutcomeTx(ctx, tx, now, c, Outcome{
				Class: OutcomeHeld, HeldReason: HeldDoubleCharge, ErrorMessage: double.Error(),
			}, actor, releaseLease)
			return held, err == nil, double, err
		}
		if err := transitionTx(ctx, tx, now, c.ID, &c.Status, c.Status, actor,
			fmt.Sprintf("ALERT %s; Stripe says %s %s", double.Error(), pi, o.Class)); err != nil {
			return nil, false, double, err
		}
		c, err := chargeLeaseReleaseTx(ctx, tx, now, c, releaseLease)
		return c, false, double, err
	}
	if !chargeMayTake(c, o) {
		if o.Class == OutcomeSucceeded && c.Terminal() && c.Status != ChargeSucceeded {
			// Money moved for a charge Tally settled without it (canceled,
			// failed, carried): never silent.
			msg := fmt.Sprintf("ALERT charge %d is %s but Stripe says PaymentIntent %s succeeded for it", c.ID, c.Status, o.StripePaymentIntentID)
			l.logger.ErrorContext(ctx, msg, "alert", "settled_charge_paid", "actor", actor)
			if err := transitionTx(ctx, tx, now, c.ID, &c.Status, c.Status, actor, msg); err != nil {
				return nil, false, nil, err
			}
		}
		c, err := chargeLeaseReleaseTx(ctx, tx, now, c, releaseLease)
		return c, false, nil, err
	}
	updated, err := chargeApplyOutcomeTx(ctx, tx, now, c, o, actor, releaseLease)
	if err != nil {
		return nil, false, nil, err
	}
	return updated, updated.Status != c.Status, nil, nil
}

// chargeLeaseReleaseTx clears the lease of c when release is set.
func chargeLeaseReleaseTx(ctx context.Context, tx pgx.Tx, now time.Time, c *Charge, release bool) (*Charge, error) {
	if !release {
		return c, nil
	}
	return scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET lease_owner = NULL, lease_expires_at = NULL, updated_at = $2
WHERE id = $1 RETURNING `+chargeColumns, c.ID, now))
}

// chargeOutcomeStatus is the status outcome o moves a charge in status from
// to (its own status when the class changes nothing).
func chargeOutcomeStatus(from ChargeStatus, o Outcome) (ChargeStatus, error) {
	switch o.Class {
	case OutcomeSucceeded:
		return ChargeSucceeded, nil
	case OutcomeFailed:
		return ChargeFailed, nil
	case OutcomeProcessing:
		return ChargeProcessing, nil
	case OutcomeUnknown:
		return ChargeUnknown, nil
	case OutcomeHeld:
		return ChargeHeld, nil
	case OutcomeRetryLater, OutcomeError:
		return from, nil
	}
	return "", fmt.Errorf("unknown outcome class %q", o.Class)
}

// chargeApplyOutcomeTx moves the locked charge c by outcome o, logs the
// transition, and keeps the period's spend (chargeSpendTx); releaseLease
// also clears its lease.
func chargeApplyOutcomeTx(ctx context.Context, tx pgx.Tx, now time.Time, c *Charge, o Outcome, actor string, releaseLease bool) (*Charge, error) {
	next, err := chargeOutcomeStatus(c.Status, o)
	if err != nil {
		return nil, err
	}
	var resolvedBy, failureCode, failureMessage, heldDetail *string
	var heldReason *HeldReason
	switch o.Class {
	case OutcomeSucceeded, OutcomeFailed:
		resolvedBy = ptr(cmp.Or(o.ResolvedBy, "stripe_response"))
	case OutcomeHeld:
		heldReason = ptr(cmp.Or(o.HeldReason, HeldUnexpectedStatus))
		detail := o.ErrorMessage
		if prefix := strings.TrimSpace(o.ErrorType + " " + o.ErrorCode); prefix != "" {
			detail = prefix + ": " + detail
		}
		heldDetail = ptr(cmp.Or(strings.TrimSpace(detail), "held"))
	}
	if o.Class == OutcomeFailed {
		failureCode = nullString(o.ErrorCode)
		failureMessage = nullString(o.ErrorMessage)
	}
	charge, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET status = $2,
    stripe_payment_intent_id = coalesce($3, stripe_payment_intent_id),
    stripe_charge_id = coalesce($4, stripe_charge_id),
    failure_code = coalesce($5, failure_code),
    failure_message = coalesce($6, failure_message),
    held_reason = coalesce($7, held_reason),
    held_detail = coalesce($8, held_detail),
    held_at = CASE WHEN $2 = 'held' AND status <> 'held' THEN $11 ELSE held_at END,
    resolved_by = coalesce($9, resolved_by),
    lease_owner = CASE WHEN $10 THEN NULL ELSE lease_owner END,
    lease_expires_at = CASE WHEN $10 THEN NULL ELSE lease_expires_at END,
    updated_at = $11
WHERE id = $1
RETURNING `+chargeColumns, c.ID, next, nullString(o.StripePaymentIntentID),
		nullString(o.StripeChargeID), failureCode, failureMessage, heldReason, heldDetail, resolvedBy, releaseLease, now))
	if err != nil {
		return nil, fmt.Errorf("error recording outcome: %w", err)
	}
	if next != c.Status {
		reason := o.ErrorCode
		if o.StripePaymentIntentID != "" {
			reason = strings.TrimSpace("payment_intent " + o.StripePaymentIntentID + " " + reason)
		}
		if heldReason != nil {
			reason = string(*heldReason) + ": " + *heldDetail
		}
		if err := transitionTx(ctx, tx, now, charge.ID, &c.Status, next, actor, reason); err != nil {
			return nil, err
		}
		if charge, err = chargeSpendTx(ctx, tx, charge); err != nil {
			return nil, err
		}
	}
	return charge, nil
}

func ptr[T any](v T) *T { return &v }

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullInt(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}
