package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Every Stripe call of a charge is a row of billing.charge_attempts, appended
// in the transaction that commits before the call (attemptStartTx) and
// finished in the one that records its outcome (attemptFinishTx).

// attemptStartTx appends the attempt row of the Stripe call about to be made
// with the claim's current key, and marks the first use of that key. The
// row's id is read when the transaction sends the insert, with its next
// statement: the caller sets Claim.AttemptID from it once the transaction
// committed.
func attemptStartTx(ctx context.Context, tx *Tx, now time.Time, claim *Claim) (*later[int64], error) {
	c := claim.Charge
	var jobID *int64
	var jobAttempt *int
	if claim.params.JobID != 0 {
		jobID, jobAttempt = &claim.params.JobID, &claim.params.JobAttempt
	}
	id := queryRowLater(tx, func(row pgx.Row) (int64, error) {
		var id int64
		if err := row.Scan(&id); err != nil {
			return 0, fmt.Errorf("error logging attempt: %w", err)
		}
		return id, nil
	}, `
INSERT INTO billing.charge_attempts (charge_id, customer_id, attempt, key_generation, idempotency_key, lease_owner,
                                     river_job_id, river_attempt, started_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING id`, c.ID, c.CustomerID, c.AttemptCount, c.KeyGeneration, c.IdempotencyKey, claim.Owner, jobID, jobAttempt, now)
	if c.GenerationFirstAttemptedAt == nil {
		if _, err := tx.Exec(ctx, `
UPDATE billing.charges SET generation_first_attempted_at = $2 WHERE id = $1`, c.ID, now); err != nil {
			return nil, fmt.Errorf("error marking first use of key: %w", err)
		}
		c.GenerationFirstAttemptedAt = &now
	}
	return id, nil
}

// attemptFinishTx finishes attempt row id with what the call returned.
func attemptFinishTx(tx *Tx, now time.Time, id int64, o Outcome) {
	// Sent with the next statement; the check runs then.
	tx.execLater(func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("attempt %d is already finished", id)
		}
		return nil
	}, `
UPDATE billing.charge_attempts
SET finished_at = $2, outcome = $3, http_status = $4, stripe_request_id = $5,
    stripe_payment_intent_id = $6, error_type = $7, error_code = $8, error_message = $9
WHERE id = $1 AND finished_at IS NULL`, id, now, o.Class, nullInt(o.HTTPStatus),
		nullString(o.StripeRequestID), nullString(o.StripePaymentIntentID), nullString(o.ErrorType),
		nullString(o.ErrorCode), nullString(o.ErrorMessage))
}
