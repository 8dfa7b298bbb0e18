package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// DoubleChargeError reports a second PaymentIntent carrying a charge's key:
// money may have moved twice, and a human must look. The charge is held
// when it was not yet final.
type DoubleChargeError struct {
	ChargeID       int64
	PaymentIntents []string
}

func (e *DoubleChargeError) Error() string {
	return fmt.Sprintf("ALERT double charge: charge %d has PaymentIntents %v", e.ChargeID, e.PaymentIntents)
}

// ChargeResolveParams are the fields of ChargeResolve. The charge is found
// by ChargeID, else by Outcome.StripePaymentIntentID, else by ChargeKey.
type ChargeResolveParams struct {
	ChargeID  int64
	ChargeKey string

	// Outcome is what Stripe says of the charge's PaymentIntent now.
	Outcome Outcome

	// Actor is who resolves: webhook:<event id>, reconciler, operator:….
	Actor string

	// PaymentIntent, when set, is what Stripe says the outcome's
	// PaymentIntent is for; one that is not the charge's
	// (Charge.PaymentIntentMismatch, against Livemode, the mode of Tally's
	// Stripe key) is never recorded: the charge is held
	// payment_intent_mismatch instead, or, settled, gets an ALERT transition.
	PaymentIntent *PaymentIntentFacts
	Livemode      bool
}

// ChargeResolve settles a charge from what Stripe says of its PaymentIntent
// (a webhook, the reconciler) in its own transaction; see ChargeResolveTx.
func (l *Ledger) ChargeResolve(ctx context.Context, p ChargeResolveParams) (*Charge, bool, error) {
	var (
		charge  *Charge
		changed bool
		double  *DoubleChargeError
		before  ChargeStatus
	)
	err := l.withTx(ctx, func(tx pgx.Tx) error {
		var err error
		double = nil
		before, err = chargeStatusTx(ctx, tx, p)
		if err != nil {
			return err
		}
		charge, changed, err = l.ChargeResolveTx(ctx, tx, p)
		if errors.As(err, &double) {
			return nil // commit the hold, if any, and report the double charge
		}
		return err
	})
	if err != nil {
		return nil, false, err
	}
	l.alertIfHeld(ctx, before, charge, p.Actor)
	if double != nil {
		return charge, changed, double
	}
	return charge, changed, nil
}

// chargeStatusTx returns the status of the charge p names ("" when none),
// before ChargeResolveTx moves it.
func chargeStatusTx(ctx context.Context, tx pgx.Tx, p ChargeResolveParams) (ChargeStatus, error) {
	var s ChargeStatus
	err := tx.QueryRow(ctx, `
SELECT status FROM billing.charges
WHERE id = $1 OR (stripe_payment_intent_id = $2 AND $2 <> '') OR (charge_key = $3 AND $3 <> '')
ORDER BY id = $1 DESC, (stripe_payment_intent_id = $2) DESC NULLS LAST LIMIT 1`,
		p.ChargeID, p.Outcome.StripePaymentIntentID, p.ChargeKey).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return s, err
}

// ChargeResolveTx settles a charge in the caller's transaction from what
// Stripe says of its PaymentIntent, and reports whether the charge changed.
// Transitions are monotonic (see chargeMayTake): a late or replayed answer
// never moves a charge backwards, so applying the same news twice, or old
// news after new, changes nothing. The lease is left alone: a worker still
// calling Stripe records its attempt later and keeps this status.
//
// It returns ErrNotFound when no charge matches (a PaymentIntent Tally did not
// create), and a *DoubleChargeError when the charge already names a different
// PaymentIntent — the charge is then held if it was not final, and the alert
// is logged in its transitions either way.
func (l *Ledger) ChargeResolveTx(ctx context.Context, tx pgx.Tx, p ChargeResolveParams) (*Charge, bool, error) {
	now := l.now()
	var row pgx.Row
	switch pi := p.Outcome.StripePaymentIntentID; {
	case p.ChargeID != 0:
		row = tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges WHERE id = $1 FOR UPDATE`, p.ChargeID)
	case pi != "" && p.ChargeKey != "":
		row = tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges
WHERE stripe_payment_intent_id = $1 OR charge_key = $2
ORDER BY (stripe_payment_intent_id = $1) DESC NULLS LAST LIMIT 1 FOR UPDATE`, pi, p.ChargeKey)
	case pi != "":
		row = tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges WHERE stripe_payment_intent_id = $1 FOR UPDATE`, pi)
	case p.ChargeKey != "":
		row = tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges WHERE charge_key = $1 FOR UPDATE`, p.ChargeKey)
	default:
		return nil, false, notFound("charge to resolve (no id, PaymentIntent or key given)")
	}
	c, err := scanCharge(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, notFound("charge for PaymentIntent %q / key %q", p.Outcome.StripePaymentIntentID, p.ChargeKey)
	}
	if err != nil {
		return nil, false, fmt.Errorf("error locking charge: %w", err)
	}

	switch p.Outcome.Class {
	case OutcomeSucceeded, OutcomeFailed, OutcomeProcessing, OutcomeHeld:
	default:
		return c, false, nil // unknown news settles nothing
	}
	if p.PaymentIntent != nil {
		if why := c.PaymentIntentMismatch(*p.PaymentIntent, p.Livemode); why != "" {
			l.logger.ErrorContext(ctx, "ALERT "+why, "charge_id", c.ID, "actor", p.Actor)
			if c.Terminal() || c.Status == ChargeHeld {
				return c, false, transitionTx(ctx, tx, now, c.ID, &c.Status, c.Status, p.Actor, "ALERT "+why)
			}
			p.Outcome = Outcome{Class: OutcomeHeld, HeldReason: HeldPaymentIntentMismatch, ErrorMessage: why}
		}
	}
	updated, changed, double, err := l.chargeTakeOutcomeTx(ctx, tx, now, c, p.Outcome, p.Actor, false)
	if err != nil {
		return nil, false, err
	}
	if double != nil {
		return updated, changed, double
	}
	return updated, changed, nil
}
