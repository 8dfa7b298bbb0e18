package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Refund is a refund of one of Tally's charges with its current status, as
// billing.refunds_current shows it: the highest-ranked status Tally has seen
// (billing.refund_status_rank: requires_action, pending < succeeded < failed,
// canceled), so a duplicated or late webhook never moves it backwards.
type Refund struct {
	StripeRefundID        string
	ChargeID              *int64
	StripeChargeID        string
	StripePaymentIntentID *string
	AmountCents           int64
	Currency              string
	Reason                *string
	StripeCreatedAt       time.Time
	Status                string // "" when no event showed one
	FailureReason         *string

	// StatusEventID and StatusEventType are the Stripe event that showed
	// Status (nil: Tally's own API call), StatusObservedAt its created.
	StatusEventID    *string
	StatusEventType  *string
	StatusObservedAt *time.Time
}

// refundColumns are the columns of billing.refunds_current that scanRefund
// reads, in its order.
const refundColumns = `stripe_refund_id, charge_id, stripe_charge_id, stripe_payment_intent_id, amount_cents,
       currency, reason, stripe_created_at, coalesce(status, ''), failure_reason, status_event_id, status_event_type,
       status_observed_at`

// scanRefund reads a Refund from a row of refundColumns.
func scanRefund(row pgx.Row) (*Refund, error) {
	var r Refund
	err := row.Scan(&r.StripeRefundID, &r.ChargeID, &r.StripeChargeID, &r.StripePaymentIntentID, &r.AmountCents,
		&r.Currency, &r.Reason, &r.StripeCreatedAt, &r.Status, &r.FailureReason, &r.StatusEventID,
		&r.StatusEventType, &r.StatusObservedAt)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// refundKind records refunds in billing.refunds and their statuses in
// billing.refund_events, with a failed refund's failure_reason.
var refundKind = adjustmentKind{
	noun: "refund", table: "billing.refunds", idColumn: "stripe_refund_id", notify: NotifyChargeRefunded,
	statusSQL: `
INSERT INTO billing.refund_events (stripe_refund_id, status, stripe_event_id, stripe_event_type, observed_at,
                                   recorded_at, customer_id, failure_reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (stripe_refund_id, (coalesce(stripe_event_id, '')), customer_id) DO NOTHING`,
	statusArgs: func(p *ChargeAdjustmentParams) []any { return []any{nullString(p.FailureReason)} },
}

// RefundRecordTx records what a Stripe event shows of a refund of one of
// Tally's charges, in tx: the refund itself in billing.refunds the first
// time (once per Stripe refund id; that row never changes) and the status it
// shows in billing.refund_events (once per refund and event), and reports
// whether that status row is new. The charge is the one the refund was first
// recorded with (a resolve's refund of another PaymentIntent), else the one
// paid by its Stripe charge or PaymentIntent; it returns ErrNotFound when
// neither is Tally's.
func (l *Ledger) RefundRecordTx(ctx context.Context, tx *Tx, p ChargeAdjustmentParams) (bool, error) {
	return l.adjustmentRecordTx(ctx, tx, &refundKind, p)
}

// RefundRecordResolve records a refund that an operator's resolve of charge
// chargeID made (of a PaymentIntent the charge does not keep), as Stripe's
// answer shows it: the refund once per Stripe refund id, and its status once.
// It reports whether the status row is new, and commits. Later webhooks about
// the refund find it by its id and record its status changes.
func (l *Ledger) RefundRecordResolve(ctx context.Context, chargeID int64, p ChargeAdjustmentParams) (bool, error) {
	p.EventID, p.EventType = "", ""
	var created bool
	err := l.withTx(ctx, func(tx *Tx) error {
		c := chargeRef{id: chargeID}
		err := tx.QueryRow(ctx, `SELECT customer_id FROM billing.charges WHERE id = $1`, chargeID).Scan(&c.customerID)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("charge %d", chargeID)
		}
		if err != nil {
			return err
		}
		created, err = l.adjustmentRecordChargeTx(ctx, tx, &refundKind, c, p)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("error recording refund %s of charge %d: %w", p.StripeID, chargeID, err)
	}
	return created, nil
}

// RefundGet returns a refund with its current status, or ErrNotFound.
func (l *Ledger) RefundGet(ctx context.Context, stripeRefundID string) (*Refund, error) {
	r, err := scanRefund(l.pool.QueryRow(ctx, `SELECT `+refundColumns+`
FROM billing.refunds_current WHERE stripe_refund_id = $1`, stripeRefundID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("refund %s", stripeRefundID)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading refund %s: %w", stripeRefundID, err)
	}
	return r, nil
}

// RefundListByCharge returns the refunds of charge chargeID with their
// current status, oldest first (by Stripe's created); none when the charge
// has none or does not exist.
func (l *Ledger) RefundListByCharge(ctx context.Context, chargeID int64) ([]*Refund, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+refundColumns+`
FROM billing.refunds_current WHERE charge_id = $1 ORDER BY stripe_created_at, stripe_refund_id`, chargeID)
	if err != nil {
		return nil, fmt.Errorf("error reading refunds of charge %d: %w", chargeID, err)
	}
	refunds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Refund, error) { return scanRefund(r) })
	if err != nil {
		return nil, fmt.Errorf("error reading refunds of charge %d: %w", chargeID, err)
	}
	return refunds, nil
}
