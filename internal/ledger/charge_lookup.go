package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Tally's own record of its Stripe calls can be lost: a restored backup, a
// failover that drops the last commits. A charge's key is therefore trusted
// only where this database holds an attempt of its generation within the key
// window; otherwise the claimant looks for the charge's PaymentIntents on
// Stripe first (Claim.Lookup), and records here that it found none.

// ChargeLookupNone records that the look-up of a claim (Claim.Lookup) found
// no PaymentIntent of the charge on Stripe, and readies the call, in one
// committed transaction: when the key expired, the next key generation (its
// count, a new idempotency key, a fresh key window, the transition logged);
// in every case the LookupRequired mark cleared, the first use of the key
// marked and the attempt row of the coming call appended. From then on this
// database holds an attempt of the generation, so a retry with the same key
// needs no new look-up until the key window passes.
//
// It returns the claim to call Stripe with, or ErrLeaseLost when the lease was
// taken over or the charge moved on meanwhile (settled by a webhook, another
// generation).
func (l *Ledger) ChargeLookupNone(ctx context.Context, claim *Claim, actor string) (*Claim, error) {
	var next *Claim
	var attempt *later[int64] // the attempt row's id
	err := l.withTx(ctx, func(tx *Tx) error {
		// Everything derives from the claim as it was, so a retried
		// transaction computes the same generation and key.
		now := l.now()
		from := claim.Charge.Status
		gen := claim.Charge.KeyGeneration
		if claim.KeyExpired {
			gen++
		}
		c, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET status = CASE WHEN $5 THEN 'pending' ELSE status END,
    key_generation = $3,
    idempotency_key = CASE WHEN $5 THEN $4 ELSE idempotency_key END,
    generation_first_attempted_at = CASE WHEN $5 THEN $6 ELSE coalesce(generation_first_attempted_at, $6) END,
    lookup_required = false,
    updated_at = $6
WHERE id = $1 AND lease_owner = $2 AND status IN ('pending', 'unknown') AND key_generation = $7
RETURNING `+chargeColumns, claim.Charge.ID, claim.Owner, gen,
			claim.Charge.IdempotencyKeyFor(gen), claim.KeyExpired, now,
			claim.Charge.KeyGeneration))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrLeaseLost
		}
		if err != nil {
			return fmt.Errorf("error readying call after look-up: %w", err)
		}
		if claim.KeyExpired {
			if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &from, c.Status, actor,
				fmt.Sprintf("key generation %d: no PaymentIntent on Stripe after the key window", gen)); err != nil {
				return err
			}
		}
		// The key's first use is marked above, with the attempt row below.
		next = &Claim{Charge: c, Owner: claim.Owner, params: claim.params}
		attempt, err = attemptStartTx(ctx, tx, now, next)
		return err
	})
	if errors.Is(err, ErrLeaseLost) {
		return nil, ErrLeaseLost
	}
	if err != nil {
		return nil, fmt.Errorf("error recording look-up of charge %d: %w", claim.Charge.ID, err)
	}
	if next.AttemptID, err = attempt.get(ctx); err != nil {
		return nil, err
	}
	return next, nil
}

// lookupMarkStatuses are the statuses from which a charge may still call
// Stripe, and so are marked by ChargeLookupMark (a past_due one's retry lists
// its PaymentIntents anyway).
var lookupMarkStatuses = []string{string(ChargePending), string(ChargeUnknown), string(ChargeHeld), string(ChargePastDue)}

// ChargeLookupMark marks every charge that may still call Stripe (pending,
// unknown, held) for a look-up at Stripe before its next call, and logs a
// transition (status unchanged) with actor and reason for each; it is what an
// operator runs after a restore or a lossy failover, when the attempts this
// database holds may not be all that Stripe saw. It commits, and returns the
// charges it marked.
func (l *Ledger) ChargeLookupMark(ctx context.Context, actor, reason string) ([]*Charge, error) {
	var marked []*Charge
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		rows, err := tx.Query(ctx, `
UPDATE billing.charges SET lookup_required = true, updated_at = $2
WHERE status = ANY($1)
RETURNING `+chargeColumns, lookupMarkStatuses, now)
		if err != nil {
			return err
		}
		if marked, err = collectCharges(rows); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
INSERT INTO billing.charge_transitions (charge_id, customer_id, from_status, to_status, actor, reason, created_at)
SELECT id, customer_id, status, status, $2, $3, $4 FROM billing.charges WHERE id = ANY($1)`,
			chargeIDs(marked), actor, "marked for a look-up at Stripe before its next call: "+reason, now)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("error marking charges for a look-up at Stripe: %w", err)
	}
	return marked, nil
}

func chargeIDs(charges []*Charge) []int64 {
	ids := make([]int64, len(charges))
	for i, c := range charges {
		ids[i] = c.ID
	}
	return ids
}

// ChargeLookupDone clears the look-up mark (LookupRequired, set by
// ChargeLookupMark) of a held charge whose PaymentIntents the caller just
// listed on Stripe and found none carrying its key (any generation): the
// look-up the mark asks for is done, and no money moved for the charge. A
// held charge never calls Stripe, so nothing can have moved since; once the
// mark is cleared, an operator may cancel it (ChargeCancel refuses a marked
// charge). It logs a transition (status unchanged) with actor, and returns
// the charge as it is after; a charge that is no longer held, or not marked,
// is returned unchanged.
func (l *Ledger) ChargeLookupDone(ctx context.Context, chargeID int64, actor string) (*Charge, error) {
	var c *Charge
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		var err error
		if c, err = chargeLockTx(ctx, tx, chargeID); err != nil {
			return err
		}
		if c.Status != ChargeHeld || !c.LookupRequired {
			return nil
		}
		if c, err = scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET lookup_required = false, updated_at = $2 WHERE id = $1 RETURNING `+chargeColumns, chargeID, now)); err != nil {
			return err
		}
		return transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, c.Status, actor,
			"looked at Stripe: no PaymentIntent carries the charge key; the look-up mark is cleared")
	})
	if err != nil {
		return nil, fmt.Errorf("error clearing the look-up mark of charge %d: %w", chargeID, err)
	}
	return c, nil
}
