package ledger

import (
	"context"
	"fmt"
	"slices"
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
	err := l.withTx(ctx, func(tx pgx.Tx) error {
		reached = 0
		now := l.now()
		var watermark int64
		if err := tx.QueryRow(ctx, `SELECT last_event_id FROM billing.usage_threshold_scan FOR UPDATE`).Scan(&watermark); err != nil {
			return fmt.Errorf("error reading the threshold scan's watermark: %w", err)
		}
		type candidate struct {
			customerID, period string
			thresholds         []int64
		}
		rows, err := tx.Query(ctx, `
SELECT e.customer_id, e.period, c.usage_alert_thresholds_cents
FROM (SELECT DISTINCT customer_id, period FROM billing.usage_events WHERE id > $1) e
JOIN billing.customers c ON c.customer_id = e.customer_id
WHERE cardinality(c.usage_alert_thresholds_cents) > 0`, watermark)
		if err != nil {
			return fmt.Errorf("error reading the periods with new events: %w", err)
		}
		candidates, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (candidate, error) {
			var c candidate
			err := row.Scan(&c.customerID, &c.period, &c.thresholds)
			return c, err
		})
		if err != nil {
			return fmt.Errorf("error reading the periods with new events: %w", err)
		}
		for _, c := range candidates {
			n, err := usageThresholdsCheckTx(ctx, tx, now, c.customerID, c.period, c.thresholds)
			if err != nil {
				return err
			}
			reached += n
		}
		// Up to the last event received more than settle ago: an ingest with
		// a lower id still in flight now is younger than that, so it is read
		// next time.
		if _, err := tx.Exec(ctx, `
UPDATE billing.usage_threshold_scan
SET scanned_at = $3,
    last_event_id = coalesce((SELECT max(id) FROM billing.usage_events WHERE id > $1 AND received_at < $2), $1)`,
			watermark, now.Add(-settle), now); err != nil {
			return fmt.Errorf("error moving the threshold scan's watermark: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return reached, nil
}

// usageThresholdsCheckTx records, for the period of customerID, each of
// thresholds its total has reached and that was not recorded before, with
// its notice, and returns how many.
func usageThresholdsCheckTx(ctx context.Context, tx pgx.Tx, now time.Time, customerID, period string, thresholds []int64) (int, error) {
	rows, err := tx.Query(ctx, `
SELECT threshold_cents FROM billing.usage_thresholds_reached WHERE customer_id = $1 AND period = $2`, customerID, period)
	if err != nil {
		return 0, fmt.Errorf("error reading the thresholds reached by %s/%s: %w", customerID, period, err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("error reading the thresholds reached by %s/%s: %w", customerID, period, err)
	}
	var open []int64
	for _, t := range thresholds {
		if !slices.Contains(done, t) {
			open = append(open, t)
		}
	}
	if len(open) == 0 {
		return 0, nil // every threshold reached: no sum to take
	}
	var total int64
	var currency string
	if err := tx.QueryRow(ctx, `
SELECT coalesce(sum(e.amount_cents), 0)::bigint, p.currency
FROM billing.periods p
LEFT JOIN billing.usage_events e ON e.customer_id = p.customer_id AND e.period = p.period
WHERE p.customer_id = $1 AND p.period = $2
GROUP BY p.currency`, customerID, period).Scan(&total, &currency); err != nil {
		return 0, fmt.Errorf("error summing %s/%s: %w", customerID, period, err)
	}
	n := 0
	for _, t := range open {
		if total < t {
			continue
		}
		tag, err := tx.Exec(ctx, `
INSERT INTO billing.usage_thresholds_reached (customer_id, period, threshold_cents, total_cents, currency, reached_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT DO NOTHING`, customerID, period, t, total, currency, now)
		if err != nil {
			return 0, fmt.Errorf("error recording threshold %d of %s/%s: %w", t, customerID, period, err)
		}
		if tag.RowsAffected() == 1 {
			recordNotice(tx, notice{typ: NotifyUsageThreshold, customerID: customerID, period: period, threshold: t})
			n++
		}
	}
	return n, nil
}

// usageThresholdTx reads threshold t of (customerID, period) as reached.
func usageThresholdTx(ctx context.Context, tx pgx.Tx, customerID, period string, t int64) (PublicThreshold, error) {
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
// tells every threshold the period reached by its close at the latest.
func usageThresholdsAtCloseTx(ctx context.Context, tx pgx.Tx, now time.Time, customerID, period string) error {
	var thresholds []int64
	if err := tx.QueryRow(ctx, `SELECT usage_alert_thresholds_cents FROM billing.customers WHERE customer_id = $1`,
		customerID).Scan(&thresholds); err != nil {
		return fmt.Errorf("error reading the thresholds of %s: %w", customerID, err)
	}
	if len(thresholds) == 0 {
		return nil
	}
	_, err := usageThresholdsCheckTx(ctx, tx, now, customerID, period, thresholds)
	return err
}
