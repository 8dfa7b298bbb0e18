package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reconciling brings a charge in line with what Stripe says of its
// PaymentIntent: a webhook (ChargeReconcileTx), the reconciler's periodic
// pass over stale charges (ChargeListStale, ChargeReconcile,
// ChargeMarkReconciled), an operator's billingctl reconcile.

// ChargeListStale returns up to limit unsettled charges (pending, unknown,
// processing) whose lease is free or expired, and whose last attempt (or
// creation, when never attempted) and last reconciliation are both older than
// before: the reconciler's work list. Pending and unknown charges come
// before processing ones (which may take days to settle), the least recently
// reconciled first, so every charge gets its turn.
func (l *Ledger) ChargeListStale(ctx context.Context, before time.Time, limit int) ([]*Charge, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+chargeColumns+`
FROM billing.charges
WHERE status IN ('pending', 'unknown', 'processing')
  AND (lease_expires_at IS NULL OR lease_expires_at < now())
  AND coalesce(last_attempted_at, created_at) < $1
  AND (reconciled_at IS NULL OR reconciled_at < $1)
ORDER BY status = 'processing', reconciled_at NULLS FIRST, coalesce(last_attempted_at, created_at)
LIMIT $2`, before, limit)
	if err != nil {
		return nil, fmt.Errorf("error listing stale charges: %w", err)
	}
	charges, err := collectCharges(rows)
	if err != nil {
		return nil, fmt.Errorf("error listing stale charges: %w", err)
	}
	return charges, nil
}

// ChargeMarkReconciled records that the reconciler checked the charge now.
func (l *Ledger) ChargeMarkReconciled(ctx context.Context, chargeID int64) error {
	if _, err := l.pool.Exec(ctx, `UPDATE billing.charges SET reconciled_at = $2 WHERE id = $1`, chargeID, l.now()); err != nil {
		return fmt.Errorf("error marking charge %d reconciled: %w", chargeID, err)
	}
	return nil
}

// ChargeReconcileParams are the fields of ChargeReconcile. The charge is
// found by ChargeID, else by Outcome.StripePaymentIntentID, else by
// ChargeKey.
type ChargeReconcileParams struct {
	ChargeID  int64
	ChargeKey string

	// Outcome is what Stripe says of the charge's PaymentIntent now.
	Outcome Outcome

	// Actor is who reconciles: webhook:<event id>, reconciler, operator:….
	Actor string

	// PaymentIntent, when set, is what Stripe says the outcome's
	// PaymentIntent is for; one that is not the charge's
	// (Charge.PaymentIntentMismatch, against Livemode, the mode of Tally's
	// Stripe key) is never recorded: the charge is held
	// payment_intent_mismatch instead, or, settled, gets an ALERT transition.
	PaymentIntent *PaymentIntentFacts
	Livemode      bool
}

// ChargeReconcile brings a charge in line with what Stripe says of its
// PaymentIntent (the reconciler, an operator) in its own transaction, and
// alerts when the charge moved into held; see ChargeReconcileTx.
func (l *Ledger) ChargeReconcile(ctx context.Context, p ChargeReconcileParams) (Applied, error) {
	var applied Applied
	var before *Charge
	err := l.withTx(ctx, func(tx *Tx) error {
		var err error
		before, applied, err = l.chargeReconcileTx(ctx, tx, p)
		return err
	})
	if err != nil {
		return Applied{}, err
	}
	l.alertIfHeld(ctx, before.Status, applied.Charge, p.Actor)
	return applied, nil
}

// ChargeReconcileTx brings a charge in line, in a Stripe event's transaction,
// with what Stripe says of its PaymentIntent (a webhook). Transitions are
// monotonic (see chargeMayTake): a late or replayed answer never moves a
// charge backwards, so applying the same news twice, or old news after new,
// changes nothing. The lease is left alone: a worker still calling Stripe
// records its attempt later and keeps this status. Unknown news (classes
// other than succeeded, failed, processing and held) settles nothing.
//
// A charge already naming a different PaymentIntent is a double charge
// (Applied.DoubleCharge): held if it was not final, alerted either way. The
// caller alerts a move into held once its transaction commits
// (AlertIfHeld). It returns ErrNotFound when no charge matches (a
// PaymentIntent Tally did not create).
func (l *Ledger) ChargeReconcileTx(ctx context.Context, tx *Tx, p ChargeReconcileParams) (Applied, error) {
	_, applied, err := l.chargeReconcileTx(ctx, tx, p)
	if err != nil {
		return Applied{}, err
	}
	return applied, nil
}

// chargeReconcileTx is ChargeReconcileTx; it also returns the charge as it
// was before.
func (l *Ledger) chargeReconcileTx(ctx context.Context, tx *Tx, p ChargeReconcileParams) (*Charge, Applied, error) {
	now := l.now()
	c, err := chargeReconciledLockTx(ctx, tx, p)
	if err != nil {
		return nil, Applied{}, err
	}
	switch p.Outcome.Class {
	case OutcomeSucceeded, OutcomeFailed, OutcomeProcessing, OutcomeHeld:
	default:
		return c, Applied{Charge: c}, nil
	}
	o := p.Outcome
	if p.PaymentIntent != nil {
		if why := c.PaymentIntentMismatch(*p.PaymentIntent, p.Livemode); why != "" {
			l.logger.ErrorContext(ctx, "ALERT "+why, AlertPaymentIntentMismatch.Attr(), "charge_id", c.ID, "actor", p.Actor)
			if c.Terminal() || c.Status == ChargeHeld {
				alerted, err := chargeAlertTx(ctx, tx, now, c, p.Actor, "ALERT "+why, leaseKeep)
				if err != nil {
					return nil, Applied{}, err
				}
				return c, Applied{Charge: alerted}, nil
			}
			o = Outcome{Class: OutcomeHeld, HeldReason: HeldPaymentIntentMismatch, ErrorMessage: why}
		}
	}
	applied, err := l.chargeApplyOutcomeTx(ctx, tx, now, c, o, p.Actor, outcomeLearned)
	if err != nil {
		return nil, Applied{}, err
	}
	return c, applied, nil
}

// chargeReconciledLockTx finds and locks the charge p names: by id, else by
// PaymentIntent (the one the charge names wins over a key match), else by
// key.
func chargeReconciledLockTx(ctx context.Context, tx *Tx, p ChargeReconcileParams) (*Charge, error) {
	var row pgx.Row
	switch pi := p.Outcome.StripePaymentIntentID; {
	case p.ChargeID != 0:
		return chargeLockTx(ctx, tx, p.ChargeID)
	case pi != "" && p.ChargeKey != "":
		row = tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges
WHERE stripe_payment_intent_id = $1 OR charge_key = $2
ORDER BY (stripe_payment_intent_id = $1) DESC NULLS LAST LIMIT 1 FOR UPDATE`, pi, p.ChargeKey)
	case pi != "":
		row = tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges WHERE stripe_payment_intent_id = $1 FOR UPDATE`, pi)
	case p.ChargeKey != "":
		row = tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges WHERE charge_key = $1 FOR UPDATE`, p.ChargeKey)
	default:
		return nil, notFound("charge to reconcile (no id, PaymentIntent or key given)")
	}
	c, err := scanCharge(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("charge for PaymentIntent %q / key %q", p.Outcome.StripePaymentIntentID, p.ChargeKey)
	}
	if err != nil {
		return nil, fmt.Errorf("error locking charge: %w", err)
	}
	return c, nil
}
