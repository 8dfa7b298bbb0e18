package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ChargeListLimitDefault and ChargeListLimitMax bound a page of ChargeList.
const (
	ChargeListLimitDefault = 50
	ChargeListLimitMax     = 500
)

// ChargeListParams filter and page ChargeList.
type ChargeListParams struct {
	Status     ChargeStatus // optional: only charges in this status
	CustomerID string       // optional: only this customer's charges
	AfterID    int64        // cursor: only charges with a smaller id (newest first)
	Limit      int          // default ChargeListLimitDefault, at most ChargeListLimitMax
}

// ChargeList returns charges newest first, one page at a time, and whether
// more follow. Pass the last charge's id as AfterID for the next page.
func (l *Ledger) ChargeList(ctx context.Context, p ChargeListParams) ([]*Charge, bool, error) {
	fe := fieldErrors{}
	if p.Status != "" && !p.Status.Valid() {
		fe.add("status", "unknown status %q: want one of %s", p.Status, chargeStatusList())
	}
	if p.Limit < 0 || p.Limit > ChargeListLimitMax {
		fe.add("limit", "must be between 1 and %d", ChargeListLimitMax)
	}
	if err := fe.err(); err != nil {
		return nil, false, err
	}
	if p.Limit == 0 {
		p.Limit = ChargeListLimitDefault
	}
	rows, err := l.pool.Query(ctx, `SELECT `+chargeColumns+`
FROM billing.charges
WHERE ($1 = '' OR status = $1)
  AND ($2 = '' OR customer_id = $2)
  AND ($3 = 0 OR id < $3)
ORDER BY id DESC
LIMIT $4`, p.Status, p.CustomerID, p.AfterID, p.Limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("error listing charges: %w", err)
	}
	charges, err := collectCharges(rows)
	if err != nil {
		return nil, false, fmt.Errorf("error listing charges: %w", err)
	}
	more := len(charges) > p.Limit
	if more {
		charges = charges[:p.Limit]
	}
	return charges, more, nil
}

// ChargeAttempt is one logged Stripe call of a charge.
type ChargeAttempt struct {
	ID                    int64
	Attempt               int
	KeyGeneration         int
	IdempotencyKey        string
	LeaseOwner            string
	RiverJobID            *int64
	RiverAttempt          *int
	StartedAt             time.Time
	FinishedAt            *time.Time
	Outcome               *string
	HTTPStatus            *int
	StripeRequestID       *string
	StripePaymentIntentID *string
	ErrorType             *string
	ErrorCode             *string
	ErrorMessage          *string
}

// chargeAttemptColumns are the columns of billing.charge_attempts that
// scanChargeAttempt reads, in its order.
const chargeAttemptColumns = `id, attempt, key_generation, idempotency_key, lease_owner, river_job_id,
       river_attempt, started_at, finished_at, outcome, http_status, stripe_request_id,
       stripe_payment_intent_id, error_type, error_code, error_message`

// scanChargeAttempt reads a ChargeAttempt from a row of chargeAttemptColumns.
func scanChargeAttempt(row pgx.Row) (*ChargeAttempt, error) {
	var a ChargeAttempt
	err := row.Scan(&a.ID, &a.Attempt, &a.KeyGeneration, &a.IdempotencyKey, &a.LeaseOwner, &a.RiverJobID,
		&a.RiverAttempt, &a.StartedAt, &a.FinishedAt, &a.Outcome, &a.HTTPStatus, &a.StripeRequestID,
		&a.StripePaymentIntentID, &a.ErrorType, &a.ErrorCode, &a.ErrorMessage)
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// ChargeTransition is one status change of a charge and who made it.
type ChargeTransition struct {
	FromStatus *string
	ToStatus   string
	Actor      string
	Reason     *string
	CreatedAt  time.Time
}

// chargeTransitionColumns are the columns of billing.charge_transitions that
// scanChargeTransition reads, in its order.
const chargeTransitionColumns = `from_status, to_status, actor, reason, created_at`

// scanChargeTransition reads a ChargeTransition from a row of
// chargeTransitionColumns.
func scanChargeTransition(row pgx.Row) (*ChargeTransition, error) {
	var t ChargeTransition
	if err := row.Scan(&t.FromStatus, &t.ToStatus, &t.Actor, &t.Reason, &t.CreatedAt); err != nil {
		return nil, err
	}
	return &t, nil
}

// ChargeHistory returns a charge's Stripe calls and status changes, oldest
// first.
func (l *Ledger) ChargeHistory(ctx context.Context, chargeID int64) ([]*ChargeAttempt, []*ChargeTransition, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+chargeAttemptColumns+`
FROM billing.charge_attempts WHERE charge_id = $1 ORDER BY id`, chargeID)
	if err != nil {
		return nil, nil, fmt.Errorf("error reading attempts of charge %d: %w", chargeID, err)
	}
	attempts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*ChargeAttempt, error) { return scanChargeAttempt(r) })
	if err != nil {
		return nil, nil, fmt.Errorf("error reading attempts of charge %d: %w", chargeID, err)
	}
	rows, err = l.pool.Query(ctx, `SELECT `+chargeTransitionColumns+`
FROM billing.charge_transitions WHERE charge_id = $1 ORDER BY id`, chargeID)
	if err != nil {
		return nil, nil, fmt.Errorf("error reading transitions of charge %d: %w", chargeID, err)
	}
	transitions, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*ChargeTransition, error) { return scanChargeTransition(r) })
	if err != nil {
		return nil, nil, fmt.Errorf("error reading transitions of charge %d: %w", chargeID, err)
	}
	return attempts, transitions, nil
}
