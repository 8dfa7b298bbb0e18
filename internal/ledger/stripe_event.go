package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Stripe event statuses.
const (
	StripeEventReceived  = "received"  // stored; its job has not finished
	StripeEventProcessed = "processed" // applied to the ledger
	StripeEventIgnored   = "ignored"   // not for Tally (unknown type, a PaymentIntent Tally did not create)
	StripeEventFailed    = "failed"    // the last attempt failed; River retries it
)

// StripeEventRetentionDefault is how long processed events are kept: longer
// than Stripe's 3-day retry schedule, so a late redelivery is still a replay.
const StripeEventRetentionDefault = 30 * 24 * time.Hour

// StripeEvent is a stored Stripe webhook event.
type StripeEvent struct {
	ID          string
	Type        string
	Payload     json.RawMessage
	Livemode    bool
	CreatedAt   time.Time
	ReceivedAt  time.Time
	Status      string
	Attempts    int
	LastError   *string
	ProcessedAt *time.Time
	JobID       *int64
}

// stripeEventColumns are the columns of billing.stripe_events that
// scanStripeEvent reads, in its order.
const stripeEventColumns = `id, type, payload, livemode, created_at, received_at, status, attempts, last_error,
       processed_at, job_id`

// scanStripeEvent reads a StripeEvent from a row of stripeEventColumns.
func scanStripeEvent(row pgx.Row) (*StripeEvent, error) {
	var ev StripeEvent
	err := row.Scan(&ev.ID, &ev.Type, &ev.Payload, &ev.Livemode, &ev.CreatedAt, &ev.ReceivedAt, &ev.Status,
		&ev.Attempts, &ev.LastError, &ev.ProcessedAt, &ev.JobID)
	if err != nil {
		return nil, err
	}
	return &ev, nil
}

// StripeEventParams are the fields of StripeEventRecord.
type StripeEventParams struct {
	ID        string
	Type      string
	Payload   []byte
	Livemode  bool
	CreatedAt time.Time
}

// StripeEventRecord stores a verified Stripe event and, in the same
// transaction, inserts the job that processes it. It reports false for an
// event id already stored (a replay): nothing new is written.
func (l *Ledger) StripeEventRecord(ctx context.Context, p StripeEventParams) (bool, error) {
	var created bool
	err := l.withTx(ctx, func(tx *Tx) error {
		tag, err := tx.Exec(ctx, `
INSERT INTO billing.stripe_events (id, type, payload, livemode, created_at, received_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (id) DO NOTHING`, p.ID, p.Type, p.Payload, p.Livemode, p.CreatedAt, l.now())
		if err != nil {
			return err
		}
		created = tag.RowsAffected() == 1
		if !created {
			return nil
		}
		jobID, err := l.config.Scheduler.StripeEventJobInsertTx(ctx, tx, p.ID)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE billing.stripe_events SET job_id = $2 WHERE id = $1`, p.ID, jobID)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("error storing stripe event %s: %w", p.ID, err)
	}
	return created, nil
}

// StripeEventHandler applies one event in the event's transaction and says
// whether it was processed or ignored, with an optional note kept in
// last_error (an alert worth keeping next to the event).
type StripeEventHandler func(ctx context.Context, tx *Tx, ev *StripeEvent) (status, note string, err error)

// StripeEventHandle processes a stored event: in one transaction it locks
// the event, runs handle, and marks the event processed or ignored — so the
// effect and the mark commit together. An event already processed or ignored
// is left alone (a redelivered job does nothing). When handle fails, nothing
// it did is kept, the event is marked failed with the error and its attempt
// counted, and the error is returned so River retries.
func (l *Ledger) StripeEventHandle(ctx context.Context, eventID string, handle StripeEventHandler) error {
	err := l.withTx(ctx, func(tx *Tx) error {
		ev, err := scanStripeEvent(tx.QueryRow(ctx, `SELECT `+stripeEventColumns+`
FROM billing.stripe_events WHERE id = $1 FOR UPDATE`, eventID))
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("stripe event %s", eventID)
		}
		if err != nil {
			return err
		}
		if ev.Status == StripeEventProcessed || ev.Status == StripeEventIgnored {
			return nil
		}
		status, note, err := handle(ctx, tx, ev)
		if err != nil {
			return &handlerError{err}
		}
		if status != StripeEventProcessed && status != StripeEventIgnored {
			return fmt.Errorf("handler returned status %q", status)
		}
		_, err = tx.Exec(ctx, `
UPDATE billing.stripe_events
SET status = $2, processed_at = $3, attempts = attempts + 1, last_error = $4
WHERE id = $1`, eventID, status, l.now(), nullString(note))
		return err
	})
	var he *handlerError
	if errors.As(err, &he) {
		if _, markErr := l.pool.Exec(ctx, `
UPDATE billing.stripe_events SET status = 'failed', attempts = attempts + 1, last_error = $2
WHERE id = $1 AND status IN ('received', 'failed')`, eventID, he.err.Error()); markErr != nil {
			l.logger.WarnContext(ctx, "error marking stripe event failed", "event_id", eventID, "error", markErr)
		}
		return fmt.Errorf("error processing stripe event %s: %w", eventID, he.err)
	}
	if err != nil {
		return fmt.Errorf("error processing stripe event %s: %w", eventID, err)
	}
	return nil
}

type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// StripeEventGet returns a stored event, or ErrNotFound.
func (l *Ledger) StripeEventGet(ctx context.Context, id string) (*StripeEvent, error) {
	ev, err := scanStripeEvent(l.pool.QueryRow(ctx, `SELECT `+stripeEventColumns+`
FROM billing.stripe_events WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("stripe event %s", id)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading stripe event %s: %w", id, err)
	}
	return ev, nil
}

// StripeEventDeleteProcessed deletes processed and ignored events received
// before before, and returns how many. Unfinished events are never deleted.
func (l *Ledger) StripeEventDeleteProcessed(ctx context.Context, before time.Time) (int64, error) {
	tag, err := l.pool.Exec(ctx, `
DELETE FROM billing.stripe_events WHERE status IN ('processed', 'ignored') AND received_at < $1`, before)
	if err != nil {
		return 0, fmt.Errorf("error deleting old stripe events: %w", err)
	}
	return tag.RowsAffected(), nil
}

// chargeRef names a charge: its id and its customer.
type chargeRef struct {
	id         int64
	customerID string
}

// chargeByStripeTx finds the charge paid by a Stripe charge or
// PaymentIntent, or returns ErrNotFound.
func chargeByStripeTx(ctx context.Context, tx *Tx, stripeChargeID, paymentIntentID string) (chargeRef, error) {
	var c chargeRef
	err := tx.QueryRow(ctx, `
SELECT id, customer_id FROM billing.charges
WHERE (stripe_charge_id = $1 AND $1 <> '') OR (stripe_payment_intent_id = $2 AND $2 <> '')
LIMIT 1`, stripeChargeID, paymentIntentID).Scan(&c.id, &c.customerID)
	if errors.Is(err, pgx.ErrNoRows) {
		return chargeRef{}, notFound("charge for stripe charge %q / PaymentIntent %q", stripeChargeID, paymentIntentID)
	}
	if err != nil {
		return chargeRef{}, fmt.Errorf("error finding charge of stripe charge %s: %w", stripeChargeID, err)
	}
	return c, nil
}
