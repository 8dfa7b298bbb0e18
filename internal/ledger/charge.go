package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// ChargeKey is the stable identity of the charge of (customerID, period) in
// deployment namespace (Config.Namespace), sent to Stripe as
// metadata.tally_charge_key: hex(sha256("tally:charge:v2:" + namespace + ":" +
// customer + ":" + period)). An empty namespace gives the v1 key of the
// charges created before namespaces ("tally:charge:v1:" + customer + ":" +
// period), which they keep.
func ChargeKey(namespace, customerID, period string) string {
	return chargeKeyHash(namespace, customerID+":"+period)
}

// ChargeIdempotencyKey is the Stripe idempotency key of generation gen of
// the charge of (customerID, period) in namespace (v1 when empty).
func ChargeIdempotencyKey(namespace, customerID, period string, gen int) string {
	return chargeKeyHash(namespace, customerID+":"+period+":"+strconv.Itoa(gen))
}

func chargeKeyHash(namespace, rest string) string {
	prefix := "tally:charge:v1:"
	if namespace != "" {
		prefix = "tally:charge:v2:" + namespace + ":"
	}
	sum := sha256.Sum256([]byte(prefix + rest))
	return hex.EncodeToString(sum[:])
}

// IdempotencyKeyFor is the charge's Stripe idempotency key of generation gen,
// derived the way its keys were (its KeyNamespace).
func (c *Charge) IdempotencyKeyFor(gen int) string {
	return ChargeIdempotencyKey(c.KeyNamespace, c.CustomerID, c.Period, gen)
}

// Charge is the charge of one (customer, period). Its amount, currency and
// Stripe customer and payment method are snapshots taken at close, so every
// retry sends identical parameters.
type Charge struct {
	ID                         int64
	CustomerID                 string
	Period                     string
	Status                     ChargeStatus
	AmountCents                int64
	Currency                   string
	EventCount                 int64
	StripeCustomerID           string
	StripePaymentMethodID      *string
	ChargeKey                  string
	IdempotencyKey             string
	KeyGeneration              int
	StripePaymentIntentID      *string
	StripeChargeID             *string
	FailureCode                *string
	FailureMessage             *string
	HeldReason                 *HeldReason
	ResolvedBy                 *string
	LeaseOwner                 *string
	LeaseExpiresAt             *time.Time
	AttemptCount               int
	FirstAttemptedAt           *time.Time
	GenerationFirstAttemptedAt *time.Time
	LastAttemptedAt            *time.Time
	CreatedAt                  time.Time
	UpdatedAt                  time.Time

	// PeriodStartsAt is when the charge's period began: a look-up at Stripe
	// lists the customer's PaymentIntents created since then.
	PeriodStartsAt time.Time

	// LookupRequired is set after Tally's record may have been lost (a
	// restore, a lossy failover; billingctl recover): the next call of the
	// charge first looks for its PaymentIntents on Stripe.
	LookupRequired bool

	// HeldDetail says in words why the charge is held (HeldReason is the
	// code); HeldAt since when; HeldAlertedAt when the reconciler last
	// reported it.
	HeldDetail    *string
	HeldAt        *time.Time
	HeldAlertedAt *time.Time

	// ApprovedAt is when an operator approved the held charge: its guards
	// (cap, budget, anomaly) are waived.
	ApprovedAt *time.Time

	// BudgetReserved is set while the charge's amount counts in the
	// period's spend (in flight or succeeded).
	BudgetReserved bool

	// LeaseLeft is how much of the lease is left, on Postgres's clock (the
	// one clock every replica shares): zero when free or expired.
	LeaseLeft time.Duration

	// CarriedInCents is the part of AmountCents carried from the customer's
	// earlier charges below Stripe's minimum; CarriedInto, on such a
	// carried_forward charge, is the charge that bills it.
	CarriedInCents int64
	CarriedInto    *int64

	// KeyNamespace is the deployment namespace the charge's keys derive from
	// (and its PaymentIntents carry as metadata.tally_namespace); empty for a
	// v1 charge, keyed before namespaces existed.
	KeyNamespace string
}

// LeaseLive reports whether a run holds the charge's lease now, on
// Postgres's clock.
func (c *Charge) LeaseLive() bool { return c.LeaseOwner != nil && c.LeaseLeft > 0 }

// Terminal reports whether the charge's status is terminal.
func (c *Charge) Terminal() bool { return c.Status.Terminal() }

const chargeColumns = `id, customer_id, period, status, amount_cents, currency, event_count,
       stripe_customer_id, stripe_payment_method_id, charge_key, idempotency_key, key_generation,
       stripe_payment_intent_id, stripe_charge_id, failure_code, failure_message, held_reason,
       resolved_by, lease_owner, lease_expires_at, attempt_count, first_attempted_at,
       generation_first_attempted_at, last_attempted_at, created_at, updated_at,
       period_starts_at, lookup_required, held_detail, held_at, held_alerted_at, approved_at,
       budget_reserved, greatest(extract(epoch FROM lease_expires_at - now()), 0)::float8 AS lease_left_seconds,
       carried_in_cents, carried_into, coalesce(key_namespace, '') AS key_namespace`

func scanCharge(row pgx.Row) (*Charge, error) {
	var c Charge
	var leftSeconds float64
	err := row.Scan(&c.ID, &c.CustomerID, &c.Period, &c.Status, &c.AmountCents, &c.Currency, &c.EventCount,
		&c.StripeCustomerID, &c.StripePaymentMethodID, &c.ChargeKey, &c.IdempotencyKey, &c.KeyGeneration,
		&c.StripePaymentIntentID, &c.StripeChargeID, &c.FailureCode, &c.FailureMessage, &c.HeldReason,
		&c.ResolvedBy, &c.LeaseOwner, &c.LeaseExpiresAt, &c.AttemptCount, &c.FirstAttemptedAt,
		&c.GenerationFirstAttemptedAt, &c.LastAttemptedAt, &c.CreatedAt, &c.UpdatedAt,
		&c.PeriodStartsAt, &c.LookupRequired, &c.HeldDetail, &c.HeldAt, &c.HeldAlertedAt, &c.ApprovedAt,
		&c.BudgetReserved, &leftSeconds, &c.CarriedInCents, &c.CarriedInto, &c.KeyNamespace)
	if err != nil {
		return nil, err
	}
	c.LeaseLeft = time.Duration(leftSeconds * float64(time.Second))
	return &c, nil
}

func collectCharges(rows pgx.Rows) ([]*Charge, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Charge, error) { return scanCharge(r) })
}

// chargeGetTx reads the charge of (customerID, period) in tx, without
// locking it, or returns ErrNotFound.
func chargeGetTx(ctx context.Context, tx pgx.Tx, customerID, period string) (*Charge, error) {
	c, err := scanCharge(tx.QueryRow(ctx, `SELECT `+chargeColumns+`
FROM billing.charges WHERE customer_id = $1 AND period = $2`, customerID, period))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("charge of %s/%s", customerID, period)
	}
	return c, err
}

// ChargeGet returns the charge with id, or ErrNotFound.
func (l *Ledger) ChargeGet(ctx context.Context, id int64) (*Charge, error) {
	c, err := scanCharge(l.pool.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("charge %d", id)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading charge %d: %w", id, err)
	}
	return c, nil
}

// ChargeGetByPeriod returns the charge of (customerID, period), or
// ErrNotFound when the period has not closed yet.
func (l *Ledger) ChargeGetByPeriod(ctx context.Context, customerID, period string) (*Charge, error) {
	var c *Charge
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		var err error
		c, err = chargeGetTx(ctx, tx, customerID, period)
		return err
	})
	return c, err
}

// transitionTx logs a status change of a charge and who made it (from is nil
// for its creation). It refuses a change the status machine does not allow
// for actor (chargeTransitions): that is a bug, and Postgres would refuse it
// too.
func transitionTx(ctx context.Context, tx pgx.Tx, now time.Time, chargeID int64, from *ChargeStatus, to ChargeStatus, actor, reason string) error {
	if from != nil && !ChargeTransitionAllowed(*from, to, actorKind(actor)) {
		return fmt.Errorf("charge %d: %s may not move it from %s to %s", chargeID, actor, *from, to)
	}
	var r *string
	if reason != "" {
		r = &reason
	}
	_, err := tx.Exec(ctx, `
INSERT INTO billing.charge_transitions (charge_id, from_status, to_status, actor, reason, created_at)
VALUES ($1, $2, $3, $4, $5, $6)`, chargeID, from, to, actor, r, now)
	if err != nil {
		return fmt.Errorf("error logging transition of charge %d to %s: %w", chargeID, to, err)
	}
	recordTransition(tx, from, to)
	return nil
}

// ChargeSetPaymentMethod snapshots the payment method of a charge that was
// created without one (its customer had none registered), once and only
// before its first attempt: a charge that has one, or that Stripe was already
// called for, keeps what it has, so every attempt sends the same parameters.
// It returns the charge as stored.
func (l *Ledger) ChargeSetPaymentMethod(ctx context.Context, chargeID int64, paymentMethodID string) (*Charge, error) {
	c, err := scanCharge(l.pool.QueryRow(ctx, `
WITH updated AS (
    UPDATE billing.charges SET stripe_payment_method_id = $2, updated_at = $3
    WHERE id = $1 AND stripe_payment_method_id IS NULL AND first_attempted_at IS NULL
    RETURNING `+chargeColumns+`
)
SELECT * FROM updated
UNION ALL
SELECT `+chargeColumns+` FROM billing.charges WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM updated)`,
		chargeID, paymentMethodID, l.now()))
	if err != nil {
		return nil, fmt.Errorf("error setting payment method of charge %d: %w", chargeID, err)
	}
	return c, nil
}

// ChargeJobRunNow makes the charge job of a charge's period run now (River
// JobRetry: available at once; a discarded job is revived, a running one left
// alone, a deleted one inserted again). The job finds the charge's state and
// does only what is left.
func (l *Ledger) ChargeJobRunNow(ctx context.Context, chargeID int64) error {
	return l.withTx(ctx, func(tx pgx.Tx) error {
		var customerID, period string
		var jobID *int64
		err := tx.QueryRow(ctx, `
SELECT c.customer_id, c.period, p.charge_job_id FROM billing.charges c
JOIN billing.periods p ON p.customer_id = c.customer_id AND p.period = c.period
WHERE c.id = $1
FOR UPDATE OF p`, chargeID).Scan(&customerID, &period, &jobID)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("charge %d", chargeID)
		}
		if err != nil {
			return fmt.Errorf("error finding charge job of charge %d: %w", chargeID, err)
		}
		return l.chargeJobRunNowTx(ctx, tx, customerID, period, jobID)
	})
}

// chargeJobRunNowTx makes the period's charge job run now and records its id
// when it changed. The caller holds the period row.
func (l *Ledger) chargeJobRunNowTx(ctx context.Context, tx pgx.Tx, customerID, period string, jobID *int64) error {
	var old int64
	if jobID != nil {
		old = *jobID
	}
	id, err := l.config.Scheduler.ChargeJobRunNowTx(ctx, tx, old, customerID, period)
	if err != nil {
		return err
	}
	if id != old {
		if _, err := tx.Exec(ctx, `UPDATE billing.periods SET charge_job_id = $3 WHERE customer_id = $1 AND period = $2`,
			customerID, period, id); err != nil {
			return fmt.Errorf("error recording charge job of %s/%s: %w", customerID, period, err)
		}
	}
	return nil
}

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

// Now returns the ledger's clock reading (Config.Clock), for callers that
// must measure time the way the ledger does.
func (l *Ledger) Now() time.Time { return l.now() }
