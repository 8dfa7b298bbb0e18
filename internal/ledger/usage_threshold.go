package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// UsageThresholdsMax bounds a customer's usage alert thresholds.
const UsageThresholdsMax = 20

// UsageThresholdSettleDefault is how long after its received_at an event's
// ingest is taken as committed or rolled back for good: ingest answers
// within its request timeout, far less (replicas' clocks must agree to well
// within it). The scan's watermark passes only events older than that, so
// an ingest still in flight with a lower id is read by a later scan; the
// close checks the final total anyway (PeriodClose).
const UsageThresholdSettleDefault = time.Minute

// PublicThreshold is what usage.threshold_reached carries: a period's
// running total reached one of its customer's thresholds.
type PublicThreshold struct {
	CustomerID     string    `json:"customer_id"`
	Period         string    `json:"period"`
	ThresholdCents int64     `json:"threshold_cents"`
	TotalCents     int64     `json:"total_cents"`
	Currency       string    `json:"currency"`
	ReachedAt      time.Time `json:"reached_at"`
}

// UsageThresholdScan finds the thresholds that periods' running totals
// crossed since the last scan, and records each once with its notification
// (usage.threshold_reached), in one transaction: it reads the events
// ingested after its watermark, sums each period they belong to whose
// customer has a threshold not yet reached, and records those the total
// reached. Ingest writes nothing for it. The watermark then moves up to the
// last event received more than settle ago: newer ones are read again next
// time, so an ingest that commits after a later one has been read is not
// missed. Scans take turns (the watermark row's lock). It returns how many
// thresholds it recorded.
func (l *Ledger) UsageThresholdScan(ctx context.Context, settle time.Duration) (int, error) {
	var reached int
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		var watermark int64
		if err := tx.QueryRow(ctx, `SELECT last_event_id FROM billing.usage_threshold_scan FOR UPDATE`).Scan(&watermark); err != nil {
			return fmt.Errorf("error reading the threshold scan's watermark: %w", err)
		}
		recorded := usageThresholdsReachTx(tx, now,
			`SELECT DISTINCT customer_id, period FROM billing.usage_events WHERE id > $2`, watermark)
		if _, err := tx.Exec(ctx, `
UPDATE billing.usage_threshold_scan
SET scanned_at = $3,
    last_event_id = coalesce((SELECT max(id) FROM billing.usage_events WHERE id > $1 AND received_at < $2), $1)`,
			watermark, now.Add(-settle), now); err != nil {
			return fmt.Errorf("error moving the threshold scan's watermark: %w", err)
		}
		var err error
		reached, err = recorded.get(ctx)
		return err
	})
	if err != nil {
		return 0, err
	}
	return reached, nil
}

// usageThresholdsReachTx records, in one statement, every threshold that
// the period total of a candidate (customer, period) — the rows of
// candidates, a query whose parameters follow $1 (now) — has reached and
// that was not recorded before, each with its notice, and returns how many
// it recorded. Only the periods with a threshold still open are summed.
//
// The statement is sent with the transaction's next one: the notices are
// recorded then, long before the transaction writes their notifications.
func usageThresholdsReachTx(tx *Tx, now time.Time, candidates string, args ...any) *later[int] {
	return queryLater(tx, func(rows pgx.Rows) (int, error) {
		var customerID, period string
		var threshold int64
		n, err := pgx.ForEachRow(rows, []any{&customerID, &period, &threshold}, func() error {
			recordNotice(tx, notice{typ: NotifyUsageThreshold, customerID: customerID, period: period, threshold: threshold})
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("error recording the usage thresholds reached: %w", err)
		}
		return int(n.RowsAffected()), nil
	}, `
WITH candidate AS (`+candidates+`),
open AS (
    SELECT c.customer_id, c.period, t.threshold_cents
    FROM candidate c
    JOIN billing.customers cu ON cu.customer_id = c.customer_id
    CROSS JOIN LATERAL unnest(cu.usage_alert_thresholds_cents) AS t(threshold_cents)
    WHERE NOT EXISTS (SELECT 1 FROM billing.usage_thresholds_reached r
                      WHERE r.customer_id = c.customer_id AND r.period = c.period AND r.threshold_cents = t.threshold_cents)
),
total AS (
    SELECT p.customer_id, p.period, p.currency,
           (SELECT coalesce(sum(e.amount_cents), 0) FROM billing.usage_events_counted e
            WHERE e.customer_id = p.customer_id AND e.period = p.period)::bigint AS total_cents
    FROM (SELECT DISTINCT customer_id, period FROM open) o
    JOIN billing.periods p ON p.customer_id = o.customer_id AND p.period = o.period
)
INSERT INTO billing.usage_thresholds_reached (customer_id, period, threshold_cents, total_cents, currency, reached_at)
SELECT o.customer_id, o.period, o.threshold_cents, t.total_cents, t.currency, $1
FROM open o JOIN total t ON t.customer_id = o.customer_id AND t.period = o.period
WHERE t.total_cents >= o.threshold_cents
ON CONFLICT DO NOTHING
RETURNING customer_id, period, threshold_cents`, append([]any{now}, args...)...)
}

// usageThresholdTx reads threshold t of (customerID, period) as reached.
func usageThresholdTx(ctx context.Context, tx *Tx, customerID, period string, t int64) (PublicThreshold, error) {
	th := PublicThreshold{CustomerID: customerID, Period: period, ThresholdCents: t}
	err := tx.QueryRow(ctx, `
SELECT total_cents, currency, reached_at FROM billing.usage_thresholds_reached
WHERE customer_id = $1 AND period = $2 AND threshold_cents = $3`, customerID, period, t).Scan(&th.TotalCents, &th.Currency, &th.ReachedAt)
	if err != nil {
		return PublicThreshold{}, fmt.Errorf("error reading threshold %d of %s/%s: %w", t, customerID, period, err)
	}
	return th, nil
}

// usageThresholdsAtCloseTx checks the thresholds of the period being closed
// against its final total, whatever the scan has read: the backstop that
// tells every threshold the period reached by its close at the latest. The
// check goes with the transaction's next statement; its notices are
// written before the transaction commits.
func usageThresholdsAtCloseTx(tx *Tx, now time.Time, customerID, period string) {
	usageThresholdsReachTx(tx, now, `SELECT $2::text AS customer_id, $3::text AS period`, customerID, period)
}
