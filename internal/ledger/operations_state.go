package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// OperationsState is what the ledger says about work in flight, for an
// operator's gauges: every read is bounded by the work in flight (open
// periods past their close, unsettled charges, unprocessed Stripe events),
// never by the ledger's history.
type OperationsState struct {
	// Now is Postgres' clock, which the ages below are measured against.
	Now time.Time

	// Charges counts the charges not yet settled, by status (pending,
	// unknown, processing, held, past_due).
	Charges map[ChargeStatus]int64

	// Held counts the held charges by reason.
	Held map[HeldReason]int64

	// CloseOverdueSince is the close time of the oldest open period past
	// its close (its charge job has not closed it), or nil.
	CloseOverdueSince *time.Time

	// UnsettledSince is when the oldest pending, unknown or processing
	// charge was created, or nil.
	UnsettledSince *time.Time

	// RetryOverdueSince is the retry time of the past_due charge whose
	// retry is the most overdue (the dunning scan has not started it, or
	// its job cannot finish it), or nil.
	RetryOverdueSince *time.Time

	// StripeEvents counts the Stripe webhook events received and not yet
	// processed ("received") or whose processing failed ("failed").
	StripeEvents map[string]int64

	// StripeEventSince is when the oldest of those was received, or nil.
	StripeEventSince *time.Time

	// ChargingPausedSince is when River's charge queue was paused (the kill
	// switch, whoever set it), or nil.
	ChargingPausedSince *time.Time

	// WebhookEndpointsDisabled counts the webhook endpoints disabled for
	// failing: nothing is sent to them until an operator enables them.
	WebhookEndpointsDisabled int64

	// UsageRolledAt is when the usage roll-ups last moved (UsageRollup), or
	// nil before the first roll-up's migration ran.
	UsageRolledAt *time.Time
}

// OperationsStateGet reads the OperationsState in one read-only
// transaction.
func (l *Ledger) OperationsStateGet(ctx context.Context) (*OperationsState, error) {
	st := &OperationsState{Charges: map[ChargeStatus]int64{}, Held: map[HeldReason]int64{}, StripeEvents: map[string]int64{}}
	err := l.withTx(ctx, func(tx *Tx) error {
		tx.execLater(nil, `SET TRANSACTION READ ONLY`) // with the first read
		if err := tx.QueryRow(ctx, `
SELECT now(),
       (SELECT min(closes_at) FROM billing.periods WHERE status = 'open' AND closes_at < now()),
       (SELECT min(created_at) FROM billing.charges WHERE status IN ('pending', 'unknown', 'processing')),
       (SELECT min(received_at) FROM billing.stripe_events WHERE status IN ('received', 'failed')),
       (SELECT count(*) FROM billing.webhook_endpoints WHERE disabled_at IS NOT NULL AND deleted_at IS NULL),
       (SELECT min(next_retry_at) FROM billing.charges WHERE status = 'past_due' AND next_retry_at < now()),
       (SELECT rolled_at FROM billing.usage_rollup_watermark)`).Scan(
			&st.Now, &st.CloseOverdueSince, &st.UnsettledSince, &st.StripeEventSince, &st.WebhookEndpointsDisabled,
			&st.RetryOverdueSince, &st.UsageRolledAt); err != nil {
			return fmt.Errorf("error reading the oldest work in flight: %w", err)
		}
		var status ChargeStatus
		var reason *HeldReason
		var n int64
		rows, err := tx.Query(ctx, `
SELECT status, held_reason, count(*) FROM billing.charges
WHERE status IN ('pending', 'unknown', 'processing', 'held', 'past_due')
GROUP BY 1, 2`)
		if err != nil {
			return fmt.Errorf("error counting unsettled charges: %w", err)
		}
		if _, err := pgx.ForEachRow(rows, []any{&status, &reason, &n}, func() error {
			st.Charges[status] += n
			if status == ChargeHeld && reason != nil {
				st.Held[*reason] += n
			}
			return nil
		}); err != nil {
			return fmt.Errorf("error counting unsettled charges: %w", err)
		}
		var eventStatus string
		rows, err = tx.Query(ctx, `
SELECT status, count(*) FROM billing.stripe_events WHERE status IN ('received', 'failed') GROUP BY 1`)
		if err != nil {
			return fmt.Errorf("error counting Stripe events: %w", err)
		}
		if _, err := pgx.ForEachRow(rows, []any{&eventStatus, &n}, func() error {
			st.StripeEvents[eventStatus] = n
			return nil
		}); err != nil {
			return fmt.Errorf("error counting Stripe events: %w", err)
		}
		charging, err := l.chargingGetTx(ctx, tx)
		if err != nil {
			return err
		}
		if charging.Paused {
			st.ChargingPausedSince = charging.Since
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error reading the operations state: %w", err)
	}
	return st, nil
}
