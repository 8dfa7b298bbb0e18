package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

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

	// Dunning (Config.DunningSchedule): PastDueSince is when Stripe first
	// declined the charge for a reason a later try can fix, NextRetryAt when
	// a past_due charge is retried next, DunningRetries how many scheduled
	// retries were made, and RetiredPaymentIntentIDs the PaymentIntents a
	// retry canceled on Stripe before creating a new one: their news never
	// moves the charge.
	PastDueSince            *time.Time
	NextRetryAt             *time.Time
	DunningRetries          int
	RetiredPaymentIntentIDs []string

	// KeyNamespace is the deployment namespace the charge's keys derive from
	// (and its PaymentIntents carry as metadata.tally_namespace); empty for a
	// v1 charge, keyed before namespaces existed.
	KeyNamespace string

	// CancelRequestedAt, by and reason: an operator asked to cancel the
	// past_due charge (ChargeCancel); its charge job cancels its
	// PaymentIntents on Stripe, then the charge.
	CancelRequestedAt *time.Time
	CancelRequestedBy *string
	CancelReason      *string
}

// LeaseLive reports whether a run holds the charge's lease now, on
// Postgres's clock.
func (c *Charge) LeaseLive() bool { return c.LeaseOwner != nil && c.LeaseLeft > 0 }

// Terminal reports whether the charge's status is terminal.
func (c *Charge) Terminal() bool { return c.Status.Terminal() }

// Retired reports whether pi is a PaymentIntent of the charge that a retry
// canceled on Stripe (RetiredPaymentIntentIDs).
func (c *Charge) Retired(pi string) bool {
	return pi != "" && slices.Contains(c.RetiredPaymentIntentIDs, pi)
}

const chargeColumns = `id, customer_id, period, status, amount_cents, currency, event_count,
       stripe_customer_id, stripe_payment_method_id, charge_key, idempotency_key, key_generation,
       stripe_payment_intent_id, stripe_charge_id, failure_code, failure_message, held_reason,
       resolved_by, lease_owner, lease_expires_at, attempt_count, first_attempted_at,
       generation_first_attempted_at, last_attempted_at, created_at, updated_at,
       period_starts_at, lookup_required, held_detail, held_at, held_alerted_at, approved_at,
       budget_reserved, greatest(extract(epoch FROM lease_expires_at - now()), 0)::float8 AS lease_left_seconds,
       carried_in_cents, carried_into, coalesce(key_namespace, '') AS key_namespace,
       past_due_since, next_retry_at, dunning_retries, retired_payment_intent_ids,
       cancel_requested_at, cancel_requested_by, cancel_reason`

func scanCharge(row pgx.Row) (*Charge, error) {
	var c Charge
	var leftSeconds float64
	err := row.Scan(&c.ID, &c.CustomerID, &c.Period, &c.Status, &c.AmountCents, &c.Currency, &c.EventCount,
		&c.StripeCustomerID, &c.StripePaymentMethodID, &c.ChargeKey, &c.IdempotencyKey, &c.KeyGeneration,
		&c.StripePaymentIntentID, &c.StripeChargeID, &c.FailureCode, &c.FailureMessage, &c.HeldReason,
		&c.ResolvedBy, &c.LeaseOwner, &c.LeaseExpiresAt, &c.AttemptCount, &c.FirstAttemptedAt,
		&c.GenerationFirstAttemptedAt, &c.LastAttemptedAt, &c.CreatedAt, &c.UpdatedAt,
		&c.PeriodStartsAt, &c.LookupRequired, &c.HeldDetail, &c.HeldAt, &c.HeldAlertedAt, &c.ApprovedAt,
		&c.BudgetReserved, &leftSeconds, &c.CarriedInCents, &c.CarriedInto, &c.KeyNamespace,
		&c.PastDueSince, &c.NextRetryAt, &c.DunningRetries, &c.RetiredPaymentIntentIDs,
		&c.CancelRequestedAt, &c.CancelRequestedBy, &c.CancelReason)
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
func chargeGetTx(ctx context.Context, tx *Tx, customerID, period string) (*Charge, error) {
	c, err := scanCharge(tx.QueryRow(ctx, `SELECT `+chargeColumns+`
FROM billing.charges WHERE customer_id = $1 AND period = $2`, customerID, period))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("charge of %s/%s", customerID, period)
	}
	return c, err
}

// chargeLockTx reads the charge with id in tx and locks it FOR UPDATE until
// tx ends, or returns ErrNotFound.
func chargeLockTx(ctx context.Context, tx *Tx, id int64) (*Charge, error) {
	c, err := scanCharge(tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges WHERE id = $1 FOR UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("charge %d", id)
	}
	if err != nil {
		return nil, fmt.Errorf("error locking charge %d: %w", id, err)
	}
	return c, nil
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
	err := l.withTx(ctx, func(tx *Tx) error {
		var err error
		c, err = chargeGetTx(ctx, tx, customerID, period)
		return err
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}
