package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// LeaseHeldError is returned by ChargeClaim when another worker holds the
// charge's lease; the caller should wait until Until and try again.
type LeaseHeldError struct {
	Owner string
	Until time.Time
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("charge lease held by %s until %s", e.Owner, e.Until.Format(time.RFC3339Nano))
}

// ChargeClaimParams are the fields of ChargeClaim.
type ChargeClaimParams struct {
	ChargeID int64

	// Owner names the claiming run uniquely (host, process, job, attempt).
	Owner string

	// LeaseTTL is how long the claim lasts. It must outlive the worker's
	// timeout, so a run that is still alive always holds its lease.
	LeaseTTL time.Duration

	// JobID and JobAttempt identify the River job run, for the attempt log.
	JobID      int64
	JobAttempt int
}

// Claim is a claimed charge and the attempt row of the Stripe call the
// claimant is about to make.
type Claim struct {
	Charge    *Charge
	AttemptID int64
	Owner     string
}

// ChargeClaim is step 2 of the money path. In one transaction it takes the
// charge's lease if the charge is pending or unknown and the lease is free or
// expired, counts the attempt, sets first_attempted_at (and that of the
// current key generation) once, and appends the attempt's row to
// billing.charge_attempts; it commits before the caller calls Stripe.
//
// It returns (nil, nil) with no claim when the charge is in any other status
// (terminal, held, processing): there is nothing to do. It returns a
// *LeaseHeldError when another live run holds the lease.
func (l *Ledger) ChargeClaim(ctx context.Context, p ChargeClaimParams) (*Claim, error) {
	var claim *Claim
	err := l.withTx(ctx, func(tx pgx.Tx) error {
		claim = nil
		now := l.now()
		c, err := scanCharge(tx.QueryRow(ctx, `SELECT `+chargeColumns+`
FROM billing.charges WHERE id = $1 FOR UPDATE`, p.ChargeID))
		if err == pgx.ErrNoRows {
			return fmt.Errorf("charge %d %w", p.ChargeID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if c.Status != ChargePending && c.Status != ChargeUnknown {
			return nil
		}
		if c.LeaseOwner != nil && c.LeaseExpiresAt.After(now) {
			return &LeaseHeldError{Owner: *c.LeaseOwner, Until: *c.LeaseExpiresAt}
		}
		c, err = scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET lease_owner = $2, lease_expires_at = $3,
    attempt_count = attempt_count + 1,
    first_attempted_at = coalesce(first_attempted_at, $4),
    generation_first_attempted_at = coalesce(generation_first_attempted_at, $4),
    last_attempted_at = $4, updated_at = $4
WHERE id = $1
RETURNING `+chargeColumns, p.ChargeID, p.Owner, now.Add(p.LeaseTTL), now))
		if err != nil {
			return fmt.Errorf("error taking lease: %w", err)
		}
		var jobID *int64
		var jobAttempt *int
		if p.JobID != 0 {
			jobID, jobAttempt = &p.JobID, &p.JobAttempt
		}
		var attemptID int64
		if err := tx.QueryRow(ctx, `
INSERT INTO billing.charge_attempts (charge_id, attempt, key_generation, idempotency_key, lease_owner,
                                     river_job_id, river_attempt, started_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING id`, c.ID, c.AttemptCount, c.KeyGeneration, c.IdempotencyKey, p.Owner, jobID, jobAttempt, now).Scan(&attemptID); err != nil {
			return fmt.Errorf("error logging attempt: %w", err)
		}
		claim = &Claim{Charge: c, AttemptID: attemptID, Owner: p.Owner}
		return nil
	})
	if err != nil {
		if _, ok := err.(*LeaseHeldError); ok {
			return nil, err
		}
		return nil, fmt.Errorf("error claiming charge %d: %w", p.ChargeID, err)
	}
	return claim, nil
}
