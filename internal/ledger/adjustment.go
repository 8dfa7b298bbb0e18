package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ChargeAdjustmentParams is a refund or a dispute of one of Tally's charges
// as one Stripe event (or Tally's own API call) shows it.
type ChargeAdjustmentParams struct {
	StripeID              string // re_… or dp_…
	StripeChargeID        string
	StripePaymentIntentID string
	AmountCents           int64
	Currency              string
	Status                string
	Reason                string
	CreatedAt             time.Time // the object's created

	// EventID and EventType are the Stripe event that shows the object
	// (empty: Tally's own API call), EventCreatedAt its created: when Stripe
	// saw this status. Zero EventCreatedAt: CreatedAt.
	EventID        string
	EventType      string
	EventCreatedAt time.Time

	// FailureReason is a refund's failure_reason (failed refunds).
	FailureReason string

	// EvidenceDueBy is a dispute's evidence_details.due_by, when set.
	EvidenceDueBy *time.Time
}

// observedAt is when Stripe saw the status p shows.
func (p *ChargeAdjustmentParams) observedAt() time.Time {
	if p.EventCreatedAt.IsZero() {
		return p.CreatedAt
	}
	return p.EventCreatedAt
}

// adjustmentKind says where one kind of charge adjustment (refunds,
// disputes) is recorded: the object itself in table, once per Stripe id
// (idColumn; that row never changes), and each status it shows with
// statusSQL, once per object and event.
type adjustmentKind struct {
	noun     string // names the kind in errors: "refund"
	table    string // billing.refunds
	idColumn string // stripe_refund_id
	notify   string // the notification of a new one: charge.refunded

	// eventIDRequired says that table's stripe_event_id is NOT NULL, so
	// the object row keeps EventID as it is; otherwise an empty EventID
	// (Tally's own API call) is stored as NULL.
	eventIDRequired bool

	// statusSQL inserts a status row unless the object has one of that
	// event already: $1 the Stripe id, $2 the status, $3 and $4 the event's
	// id and type (NULL when empty), $5 when Stripe saw the status, $6 when
	// Tally recorded it, $7 the charge's customer, then from $8
	// statusArgs(p), the kind's own columns.
	statusSQL  string
	statusArgs func(p *ChargeAdjustmentParams) []any
}

// adjustmentRecordTx records what p shows of an adjustment of kind k in tx:
// the object the first time, adjusting the charge recorded with it when it
// is known already, else the charge paid by its Stripe charge or
// PaymentIntent (ErrNotFound when neither is Tally's); then its status. It
// reports whether the status row is new.
//
// It runs in a Stripe event's transaction (StripeEventHandle), which writes
// the notification of a new adjustment before it commits.
func (l *Ledger) adjustmentRecordTx(ctx context.Context, tx *Tx, k *adjustmentKind, p ChargeAdjustmentParams) (bool, error) {
	charge, err := adjustmentChargeTx(ctx, tx, k, p)
	if err != nil {
		return false, err
	}
	return l.adjustmentRecordChargeTx(ctx, tx, k, charge, p)
}

// adjustmentRecordChargeTx records what p shows of an adjustment of kind k
// of charge c in tx: the object unless it is known (once per Stripe id),
// and the status p shows, if any (once per object and event). It reports
// whether the status row is new.
func (l *Ledger) adjustmentRecordChargeTx(ctx context.Context, tx *Tx, k *adjustmentKind, c chargeRef, p ChargeAdjustmentParams) (bool, error) {
	now := l.now()
	var eventID any = nullString(p.EventID)
	if k.eventIDRequired {
		eventID = p.EventID
	}
	tag, err := tx.Exec(ctx, `
INSERT INTO `+k.table+` (`+k.idColumn+`, charge_id, customer_id, stripe_charge_id, stripe_payment_intent_id,
       amount_cents, currency, status, reason, stripe_created_at, recorded_at, stripe_event_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (`+k.idColumn+`, customer_id) DO NOTHING`, p.StripeID, c.id, c.customerID, p.StripeChargeID,
		nullString(p.StripePaymentIntentID), p.AmountCents, p.Currency, nullString(p.Status), nullString(p.Reason), p.CreatedAt,
		now, eventID)
	if err != nil {
		return false, fmt.Errorf("error recording %s %s: %w", k.noun, p.StripeID, err)
	}
	if tag.RowsAffected() == 1 {
		recordNotice(tx, notice{typ: k.notify, chargeID: c.id})
	}
	if p.Status == "" {
		return false, nil
	}
	args := append([]any{p.StripeID, p.Status, nullString(p.EventID), nullString(p.EventType), p.observedAt(), now, c.customerID},
		k.statusArgs(&p)...)
	tag, err = tx.Exec(ctx, k.statusSQL, args...)
	if err != nil {
		return false, fmt.Errorf("error recording status %s of %s %s: %w", p.Status, k.noun, p.StripeID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// adjustmentChargeTx returns the charge an adjustment of kind k adjusts: the
// one recorded with it when it is known already, else the charge paid by its
// Stripe charge or PaymentIntent. It returns ErrNotFound when neither is
// Tally's.
func adjustmentChargeTx(ctx context.Context, tx *Tx, k *adjustmentKind, p ChargeAdjustmentParams) (chargeRef, error) {
	var id *int64
	var customerID string
	err := tx.QueryRow(ctx, `SELECT charge_id, customer_id FROM `+k.table+` WHERE `+k.idColumn+` = $1`, p.StripeID).
		Scan(&id, &customerID)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return chargeRef{}, fmt.Errorf("error reading %s: %w", p.StripeID, err)
	}
	if id != nil {
		return chargeRef{id: *id, customerID: customerID}, nil
	}
	c, err := chargeByStripeTx(ctx, tx, p.StripeChargeID, p.StripePaymentIntentID)
	if err == nil && customerID != "" {
		// Known without its charge (a row from before migration 00034, which
		// gave it a customer): it stays that customer's, one row per Stripe id.
		c.customerID = customerID
	}
	return c, err
}
