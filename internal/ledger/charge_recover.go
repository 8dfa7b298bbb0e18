package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ChargeRecoverLostParams are the fields of ChargeRecoverLost.
type ChargeRecoverLostParams struct {
	// CustomerID and Period name the charge, as its PaymentIntents'
	// metadata (customer_id, period) do.
	CustomerID string
	Period     string

	// PaymentIntents are the ids of the PaymentIntents on Stripe that carry
	// the charge's key, for the record.
	PaymentIntents []string

	// Actor is who recovers (cli:…), Reason what was lost, for the record.
	Actor  string
	Reason string

	// Outcome says what the PaymentIntents mean for the charge as the
	// restored ledger closes it (amount, currency, customer): its outcome,
	// or a hold (payment_intent_mismatch when the restored sum differs from
	// what was charged, double_charge).
	Outcome func(c *Charge) Outcome
}

// ChargeRecoverLost gives back to the ledger a charge that Stripe has and
// the ledger lost: a restored backup or a lossy failover dropped the
// period's close and its charge row, while Stripe kept the PaymentIntents
// created for it (their metadata carries the charge key of this
// deployment's namespace). In one transaction it creates the period if the
// ledger lost it too, closes it and creates its charge from the events the
// ledger holds (pending even at zero: money moved), and applies p.Outcome as
// the reconciler does (the status machine's rules, a mismatch held). It
// logs who recovered it and why. It returns the charge and whether it
// created it; a charge the ledger has (the periods's close survived) is
// returned as it is, for the caller to reconcile. It returns a
// *ValidationError when the customer is unknown to the ledger (lost too:
// create it again, then recover again), or when the period label does not
// fit TALLY_PERIOD.
func (l *Ledger) ChargeRecoverLost(ctx context.Context, p ChargeRecoverLostParams) (*Charge, bool, error) {
	b, err := l.config.Cadence.ParseLabel(p.Period)
	if err != nil || !ValidID(p.CustomerID) {
		return nil, false, &ValidationError{Fields: map[string]string{"period": fmt.Sprintf(
			"%q of customer %q is not a %s period label of this deployment (TALLY_PERIOD)", p.Period, p.CustomerID, l.config.Cadence)}}
	}
	var charge, created *Charge
	err = l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		open, err := periodOpeningTx(ctx, tx, p.CustomerID)
		if errors.Is(err, pgx.ErrNoRows) {
			return &ValidationError{Fields: map[string]string{"customer_id": fmt.Sprintf(
				"customer %q is not in the ledger (lost too): create it again with PUT /v1/customers/%s, then run recover again",
				p.CustomerID, p.CustomerID)}}
		}
		if err != nil {
			return fmt.Errorf("error reading customer: %w", err)
		}
		if c, err := scanCharge(tx.QueryRow(ctx, `SELECT `+chargeColumns+`
FROM billing.charges WHERE customer_id = $1 AND period = $2`, p.CustomerID, p.Period)); err == nil {
			charge = c
			return nil
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("error reading charge: %w", err)
		}
		if err := l.periodCreateTx(ctx, tx, now, periodKey{customerID: p.CustomerID, period: p.Period}, b,
			b.EndsAt.Add(l.config.CloseGrace), open); err != nil {
			return err
		}
		c, err := l.periodCloseTx(ctx, tx, now, PeriodCloseParams{CustomerID: p.CustomerID, Period: p.Period,
			Actor: p.Actor, paidOnStripe: true})
		if err != nil {
			return err
		}
		if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, c.Status, p.Actor, fmt.Sprintf(
			"recovered: the ledger had lost this charge (%s); Stripe has %s carrying its key",
			p.Reason, strings.Join(p.PaymentIntents, ", "))); err != nil {
			return err
		}
		applied, err := l.chargeApplyOutcomeTx(ctx, tx, now, c, p.Outcome(c), "reconciler", outcomeLearned)
		if err != nil {
			return err
		}
		charge, created = applied.Charge, applied.Charge
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("error recovering the lost charge of %s/%s: %w", p.CustomerID, p.Period, err)
	}
	if created != nil {
		l.alertIfHeld(ctx, ChargePending, created, "reconciler")
	}
	return charge, created != nil, nil
}

// RecoverSinceDefault is where, when the operator does not say, the look for
// charges the ledger lost starts: an hour before the earlier of the oldest
// open period's start and the newest change of a charge. A charge lost with
// the last commits belongs to a period the ledger has open (its close was
// lost) or lost whole (every event of it was lost too), and its
// PaymentIntents were created after the newest change the ledger kept.
// With neither, the zero time (everything).
func (l *Ledger) RecoverSinceDefault(ctx context.Context) (time.Time, error) {
	var since *time.Time
	err := l.pool.QueryRow(ctx, `
SELECT least((SELECT min(starts_at) FROM billing.periods WHERE status = 'open'),
             (SELECT max(updated_at) FROM billing.charges)) - interval '1 hour'`).Scan(&since)
	if err != nil {
		return time.Time{}, fmt.Errorf("error reading where the ledger's record ends: %w", err)
	}
	if since == nil {
		return time.Time{}, nil
	}
	return *since, nil
}
