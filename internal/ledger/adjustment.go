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

// adjustmentChargeTx returns the charge a refund or dispute adjusts: the one
// recorded with it when it is known already (existingSQL, which selects the
// charge_id of the object $1), else the charge paid by its Stripe charge or
// PaymentIntent. It returns ErrNotFound when neither is Tally's.
func adjustmentChargeTx(ctx context.Context, tx pgx.Tx, existingSQL string, p ChargeAdjustmentParams) (int64, error) {
	var id *int64
	err := tx.QueryRow(ctx, existingSQL, p.StripeID).Scan(&id)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("error reading %s: %w", p.StripeID, err)
	}
	if id != nil {
		return *id, nil
	}
	return chargeIDByStripeTx(ctx, tx, p.StripeChargeID, p.StripePaymentIntentID)
}
