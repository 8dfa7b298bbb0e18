package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Dispute is a dispute of one of Tally's charges with its current status, as
// billing.disputes_current shows it: the highest-ranked status Tally has seen
// (billing.dispute_status_rank: warning_needs_response < warning_under_review
// < needs_response < under_review < won, lost, warning_closed), so a
// duplicated or late webhook never moves it backwards.
type Dispute struct {
	StripeDisputeID       string
	ChargeID              *int64
	StripeChargeID        string
	StripePaymentIntentID *string
	AmountCents           int64
	Currency              string
	Reason                *string
	StripeCreatedAt       time.Time
	Status                string // "" when no event showed one

	// EvidenceDueBy is when Stripe needs the evidence, as the current status's
	// event showed it.
	EvidenceDueBy *time.Time

	// StatusEventID and StatusEventType are the Stripe event that showed
	// Status, StatusObservedAt its created.
	StatusEventID    *string
	StatusEventType  *string
	StatusObservedAt *time.Time

	// FundsWithdrawnAt and FundsReinstatedAt are the created of the first
	// charge.dispute.funds_withdrawn and charge.dispute.funds_reinstated.
	FundsWithdrawnAt  *time.Time
	FundsReinstatedAt *time.Time
}

// disputeColumns are the columns of billing.disputes_current that
// scanDispute reads, in its order.
const disputeColumns = `stripe_dispute_id, charge_id, stripe_charge_id, stripe_payment_intent_id, amount_cents,
       currency, reason, stripe_created_at, coalesce(status, ''), evidence_due_by, status_event_id, status_event_type,
       status_observed_at, funds_withdrawn_at, funds_reinstated_at`

// scanDispute reads a Dispute from a row of disputeColumns.
func scanDispute(row pgx.Row) (*Dispute, error) {
	var d Dispute
	err := row.Scan(&d.StripeDisputeID, &d.ChargeID, &d.StripeChargeID, &d.StripePaymentIntentID, &d.AmountCents,
		&d.Currency, &d.Reason, &d.StripeCreatedAt, &d.Status, &d.EvidenceDueBy, &d.StatusEventID,
		&d.StatusEventType, &d.StatusObservedAt, &d.FundsWithdrawnAt, &d.FundsReinstatedAt)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// disputeKind records disputes in billing.disputes (whose stripe_event_id is
// NOT NULL: a dispute is only ever seen in an event) and their statuses in
// billing.dispute_events, with the disputed amount and when Stripe needs the
// evidence.
var disputeKind = adjustmentKind{
	noun: "dispute", table: "billing.disputes", idColumn: "stripe_dispute_id", eventIDRequired: true,
	notify: NotifyChargeDisputed,
	statusSQL: `
INSERT INTO billing.dispute_events (stripe_dispute_id, status, stripe_event_id, stripe_event_type, observed_at,
                                    recorded_at, customer_id, amount_cents, evidence_due_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (stripe_dispute_id, (coalesce(stripe_event_id, '')), customer_id) DO NOTHING`,
	statusArgs: func(p *ChargeAdjustmentParams) []any { return []any{p.AmountCents, p.EvidenceDueBy} },
}

// DisputeRecordTx records what a Stripe event shows of a dispute of one of
// Tally's charges, in tx: the dispute itself in billing.disputes the first
// time (once per Stripe dispute id; that row never changes) and the status
// it shows in billing.dispute_events (once per dispute and event), and
// reports whether that status row is new. It returns ErrNotFound when the
// disputed charge is not Tally's.
func (l *Ledger) DisputeRecordTx(ctx context.Context, tx *Tx, p ChargeAdjustmentParams) (bool, error) {
	return l.adjustmentRecordTx(ctx, tx, &disputeKind, p)
}

// DisputeGet returns a dispute with its current status, or ErrNotFound.
func (l *Ledger) DisputeGet(ctx context.Context, stripeDisputeID string) (*Dispute, error) {
	d, err := scanDispute(l.pool.QueryRow(ctx, `SELECT `+disputeColumns+`
FROM billing.disputes_current WHERE stripe_dispute_id = $1`, stripeDisputeID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("dispute %s", stripeDisputeID)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading dispute %s: %w", stripeDisputeID, err)
	}
	return d, nil
}

// DisputeListByCharge returns the disputes of charge chargeID with their
// current status, oldest first (by Stripe's created); none when the charge
// has none or does not exist.
func (l *Ledger) DisputeListByCharge(ctx context.Context, chargeID int64) ([]*Dispute, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+disputeColumns+`
FROM billing.disputes_current WHERE charge_id = $1 ORDER BY stripe_created_at, stripe_dispute_id`, chargeID)
	if err != nil {
		return nil, fmt.Errorf("error reading disputes of charge %d: %w", chargeID, err)
	}
	disputes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Dispute, error) { return scanDispute(r) })
	if err != nil {
		return nil, fmt.Errorf("error reading disputes of charge %d: %w", chargeID, err)
	}
	return disputes, nil
}
