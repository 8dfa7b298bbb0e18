package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Delivery statuses: pending until the endpoint answers 2xx (delivered),
// the attempts run out (failed) or the endpoint is deleted (canceled).
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
	DeliveryCanceled  = "canceled"
)

// WebhookDelivery is one notification to send to one endpoint.
type WebhookDelivery struct {
	ID             int64
	Status         string
	AttemptCount   int
	NotificationID string
	Type           string
	Body           []byte // exactly what is posted and signed
	Endpoint       *WebhookEndpoint
	Secrets        []string // the endpoint's secrets that sign now (SigningSecrets)
	EndpointGone   bool     // deleted since
}

// WebhookDeliveryGet returns delivery id with its notification's body and
// its endpoint, or ErrNotFound.
func (l *Ledger) WebhookDeliveryGet(ctx context.Context, id int64) (*WebhookDelivery, error) {
	var d WebhookDelivery
	var deletedAt *time.Time
	e, err := scanWebhookEndpoint(l.pool.QueryRow(ctx, `
SELECT `+webhookEndpointColumns+`, e.deleted_at, d.id, d.status, d.attempt_count, n.id, n.type, n.body::text
FROM billing.webhook_deliveries d
JOIN billing.notifications n ON n.id = d.notification_id AND n.customer_id = d.customer_id
JOIN billing.webhook_endpoints e ON e.id = d.endpoint_id
WHERE d.id = $1`, id), &deletedAt, &d.ID, &d.Status, &d.AttemptCount, &d.NotificationID, &d.Type, &d.Body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("webhook delivery %d", id)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading webhook delivery %d: %w", id, err)
	}
	d.Endpoint, d.EndpointGone, d.Secrets = e, deletedAt != nil, e.SigningSecrets(l.now())
	return &d, nil
}

// WebhookDeliveryCancel cancels pending delivery id (its endpoint was
// deleted).
func (l *Ledger) WebhookDeliveryCancel(ctx context.Context, id int64) error {
	if _, err := l.pool.Exec(ctx, `
UPDATE billing.webhook_deliveries SET status = 'canceled', updated_at = $2 WHERE id = $1 AND status = 'pending'`, id, l.now()); err != nil {
		return fmt.Errorf("error canceling webhook delivery %d: %w", id, err)
	}
	return nil
}

// WebhookAttempt is one try of a delivery.
type WebhookAttempt struct {
	DeliveryID int64
	StartedAt  time.Time
	Latency    time.Duration
	StatusCode int    // 0: no answer (Error says why)
	Error      string // why it failed, "" for a 2xx
	Excerpt    string // the start of the answer's body (bounded by the caller)

	// Last says no attempt follows this one: a failure fails the delivery.
	Last bool
}

// Delivered says whether the endpoint took the notification.
func (a WebhookAttempt) Delivered() bool { return a.StatusCode >= 200 && a.StatusCode < 300 }

// AttemptRecorded is what WebhookAttemptRecord did.
type AttemptRecorded struct {
	// Status is the delivery's status after the attempt.
	Status string

	// Disabled is set when this attempt, the last of a delivery, disabled
	// its endpoint: nothing was delivered to it since the delivery was
	// written, days ago.
	Disabled bool
}

// WebhookAttemptRecord logs attempt a and moves its delivery on: delivered
// on a 2xx, failed when a was the last, pending otherwise. A delivery that
// is no longer pending (canceled meanwhile) only gains the log line. A
// delivery that fails disables its endpoint when nothing was delivered to
// the endpoint since the delivery was written.
func (l *Ledger) WebhookAttemptRecord(ctx context.Context, a WebhookAttempt) (AttemptRecorded, error) {
	status := DeliveryPending
	switch {
	case a.Delivered():
		status = DeliveryDelivered
	case a.Last:
		status = DeliveryFailed
	}
	var rec AttemptRecorded
	err := l.withTx(ctx, func(tx *Tx) error {
		rec = AttemptRecorded{}
		now := l.now()
		var attempt int
		var endpointID int64
		var customerID string
		err := tx.QueryRow(ctx, `
UPDATE billing.webhook_deliveries
SET attempt_count = attempt_count + 1, last_attempt_at = $3,
    status = CASE WHEN status = 'pending' THEN $2 ELSE status END,
    delivered_at = CASE WHEN status = 'pending' AND $2 = 'delivered' THEN $3 ELSE delivered_at END,
    updated_at = $3
WHERE id = $1
RETURNING attempt_count, status, endpoint_id, customer_id`, a.DeliveryID, status, now).Scan(&attempt, &rec.Status, &endpointID, &customerID)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("webhook delivery %d", a.DeliveryID)
		}
		if err != nil {
			return fmt.Errorf("error recording attempt of webhook delivery %d: %w", a.DeliveryID, err)
		}
		_, err = tx.Exec(ctx, `
INSERT INTO billing.webhook_attempts (delivery_id, customer_id, attempt, started_at, latency_ms, status_code, error, response_excerpt)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, a.DeliveryID, customerID, attempt, a.StartedAt, a.Latency.Milliseconds(),
			nullInt(a.StatusCode), nullString(a.Error), nullString(a.Excerpt))
		if err != nil {
			return fmt.Errorf("error logging attempt of webhook delivery %d: %w", a.DeliveryID, err)
		}
		if rec.Status != DeliveryFailed || status != DeliveryFailed {
			return nil
		}
		tag, err := tx.Exec(ctx, `
UPDATE billing.webhook_endpoints e
SET disabled_at = $3, disabled_reason = $4, updated_at = $3
WHERE e.id = $1 AND e.disabled_at IS NULL
  AND NOT EXISTS (SELECT FROM billing.webhook_deliveries ok
                  WHERE ok.endpoint_id = e.id AND ok.delivered_at >= (SELECT created_at FROM billing.webhook_deliveries WHERE id = $2))`,
			endpointID, a.DeliveryID, now, fmt.Sprintf("delivery %d failed every attempt (last: %s) and nothing was delivered since it was written", a.DeliveryID, a.Error))
		if err != nil {
			return fmt.Errorf("error disabling webhook endpoint %d: %w", endpointID, err)
		}
		rec.Disabled = tag.RowsAffected() == 1
		return nil
	})
	if err != nil {
		return AttemptRecorded{}, err
	}
	return rec, nil
}

// WebhookRedeliverParams select the deliveries WebhookRedeliver sends again;
// at least one is required, and all given must match.
type WebhookRedeliverParams struct {
	NotificationID string
	EndpointID     int64
	Since, Until   *time.Time // when the notification was written: [Since, Until)
	DryRun         bool       // count them, send nothing
}

// WebhookRedeliver sends the selected deliveries again: each one that is
// delivered or failed (not one still pending, nor one canceled or to a
// deleted endpoint) becomes pending with a new job, the same notification
// id, so a receiver that has it already drops it. It returns how many.
func (l *Ledger) WebhookRedeliver(ctx context.Context, p WebhookRedeliverParams) (int, error) {
	if p.NotificationID == "" && p.EndpointID == 0 && p.Since == nil && p.Until == nil {
		return 0, &ValidationError{Fields: map[string]string{"selection": "name a notification, an endpoint or a time range"}}
	}
	var n int
	err := l.withTx(ctx, func(tx *Tx) error {
		n = 0
		rows, err := tx.Query(ctx, `
SELECT d.id FROM billing.webhook_deliveries d
JOIN billing.notifications n ON n.id = d.notification_id AND n.customer_id = d.customer_id
JOIN billing.webhook_endpoints e ON e.id = d.endpoint_id
WHERE d.status IN ('delivered', 'failed') AND e.deleted_at IS NULL
  AND ($1 = '' OR d.notification_id = $1)
  AND ($2 = 0 OR d.endpoint_id = $2)
  AND ($3::timestamptz IS NULL OR n.created_at >= $3)
  AND ($4::timestamptz IS NULL OR n.created_at < $4)
ORDER BY d.id
FOR UPDATE OF d`, p.NotificationID, p.EndpointID, p.Since, p.Until)
		if err != nil {
			return fmt.Errorf("error selecting deliveries: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("error selecting deliveries: %w", err)
		}
		n = len(ids)
		if p.DryRun || n == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `
UPDATE billing.webhook_deliveries SET status = 'pending', updated_at = $2 WHERE id = ANY($1)`, ids, l.now()); err != nil {
			return fmt.Errorf("error reopening deliveries: %w", err)
		}
		for _, id := range ids {
			if _, err := l.config.Scheduler.WebhookDeliveryJobInsertTx(ctx, tx, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}
