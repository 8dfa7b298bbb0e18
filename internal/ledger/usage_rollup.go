package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Usage roll-ups (billing.usage_rollups, migration 00026) are what the usage
// API and the usage thresholds read: per (customer, period, metric, hour of
// occurred_at), the count, quantity and pre-priced amount of the events that
// count. UsageRollup adds the events and voids committed since its
// watermark, in the transaction that moves the watermark, so each is added
// exactly once; ingest writes nothing for it. The close never reads them.

// UsageRollupBatchMax bounds the event ids one roll-up transaction adds: a
// backlog is added in several, each short.
const UsageRollupBatchMax = 100_000

// UsageRollupResult is what one roll-up did.
type UsageRollupResult struct {
	// Periods is how many (customer, period) roll-ups it changed.
	Periods int
	// Thresholds is how many usage thresholds it found reached.
	Thresholds int
	// More is true when a backlog remains that the next call adds at once.
	More bool
}

// UsageRollup adds to the roll-ups the events and voids whose ids are at
// or below the watermark's pending ids, once every transaction that could
// still commit one of them has ended, then takes the next pending ids; and
// records the usage thresholds that the rated totals of the periods it
// changed reached, each with its usage.threshold_reached notification.
//
// Ids are taken in one order and committed in another: an event with a
// lower id may commit after one with a higher id was read. So the pending
// ids are noted, then (in the next statement, with a newer snapshot) the
// first transaction id not yet assigned; once no transaction below it is
// running, every id up to the pending ones is committed or rolled back for
// good. That holds because ingest and voids lock their period's row,
// which assigns their transaction id, before they take an id. A roll-up
// running while another holds the watermark does nothing.
func (l *Ledger) UsageRollup(ctx context.Context) (UsageRollupResult, error) {
	var res UsageRollupResult
	err := l.withTx(ctx, func(tx *Tx) error {
		res = UsageRollupResult{}
		now := l.now()
		var eventID, voidID int64
		var pendingEvent, pendingVoid *int64
		var settled bool
		err := tx.QueryRow(ctx, `
SELECT event_id, void_id, pending_event_id, pending_void_id,
       pending_xid IS NOT NULL AND pg_snapshot_xmin(pg_current_snapshot()) >= pending_xid
FROM billing.usage_rollup_watermark
FOR UPDATE SKIP LOCKED`).Scan(&eventID, &voidID, &pendingEvent, &pendingVoid, &settled)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // another roll-up holds it
		}
		if err != nil {
			return fmt.Errorf("error reading the roll-up watermark: %w", err)
		}
		if pendingEvent != nil && !settled {
			return nil // a transaction that may hold a pending id is still running
		}
		var touched []periodKey
		if pendingEvent != nil {
			toEvent, toVoid := min(*pendingEvent, eventID+UsageRollupBatchMax), voidID
			if toEvent == *pendingEvent {
				toVoid = *pendingVoid // voids go with the last chunk
			}
			if touched, err = usageRollupAddTx(ctx, tx, eventID, toEvent, voidID, toVoid); err != nil {
				return err
			}
			eventID, voidID = toEvent, toVoid
			res.Periods, res.More = len(touched), toEvent < *pendingEvent
		}
		if res.More {
			if _, err := tx.Exec(ctx, `UPDATE billing.usage_rollup_watermark SET event_id = $1, rolled_at = $2`,
				eventID, now); err != nil {
				return fmt.Errorf("error moving the roll-up watermark: %w", err)
			}
		} else {
			// Two statements: the transaction id is read with a snapshot
			// taken after the sequences were.
			if _, err := tx.Exec(ctx, `
UPDATE billing.usage_rollup_watermark
SET event_id = $1, void_id = $2, rolled_at = $3,
    pending_event_id = greatest($1, coalesce(pg_sequence_last_value(pg_get_serial_sequence('billing.usage_events', 'id')::regclass), 0)),
    pending_void_id = greatest($2, coalesce(pg_sequence_last_value(pg_get_serial_sequence('billing.usage_event_voids', 'id')::regclass), 0))`,
				eventID, voidID, now); err != nil {
				return fmt.Errorf("error moving the roll-up watermark: %w", err)
			}
			if _, err := tx.Exec(ctx, `UPDATE billing.usage_rollup_watermark SET pending_xid = pg_snapshot_xmax(pg_current_snapshot())`); err != nil {
				return fmt.Errorf("error noting the roll-up's transaction horizon: %w", err)
			}
		}
		if len(touched) == 0 {
			return nil
		}
		res.Thresholds, err = l.usageThresholdsRatedTx(ctx, tx, now, touched)
		return err
	})
	if err != nil {
		return UsageRollupResult{}, fmt.Errorf("error rolling up usage: %w", err)
	}
	return res, nil
}

// usageRollupAddTx adds the events with ids in (fromEvent, toEvent] and
// subtracts the events voided by the voids with ids in (fromVoid, toVoid],
// in one statement, and returns the (customer, period)s it changed. It runs
// planFresh: a plan cached while the ledger was small would scan it whole.
func usageRollupAddTx(ctx context.Context, tx *Tx, fromEvent, toEvent, fromVoid, toVoid int64) ([]periodKey, error) {
	rows, err := tx.Query(ctx, `
WITH delta AS (
    SELECT customer_id, period, CASE WHEN amount_cents IS NULL THEN metric ELSE '' END AS metric,
           date_trunc('hour', occurred_at, 'UTC') AS bucket_start, count(*) AS events,
           coalesce(sum(quantity) FILTER (WHERE amount_cents IS NULL), 0) AS quantity,
           coalesce(sum(amount_cents), 0) AS amount_cents
    FROM billing.usage_events
    WHERE id > $1 AND id <= $2
    GROUP BY 1, 2, 3, 4
    UNION ALL
    SELECT e.customer_id, e.period, CASE WHEN e.amount_cents IS NULL THEN e.metric ELSE '' END,
           date_trunc('hour', e.occurred_at, 'UTC'), -count(*),
           -coalesce(sum(e.quantity) FILTER (WHERE e.amount_cents IS NULL), 0), -coalesce(sum(e.amount_cents), 0)
    FROM billing.usage_event_voids v
    JOIN billing.usage_events e ON e.customer_id = v.customer_id AND e.event_id = v.event_id
    WHERE v.id > $3 AND v.id <= $4
    GROUP BY 1, 2, 3, 4
),
upsert AS (
    INSERT INTO billing.usage_rollups AS r (customer_id, period, metric, bucket_start, events, quantity, amount_cents)
    SELECT customer_id, period, metric, bucket_start, sum(events), sum(quantity), sum(amount_cents)
    FROM delta
    GROUP BY 1, 2, 3, 4
    ON CONFLICT (customer_id, period, metric, bucket_start) DO UPDATE
    SET events = r.events + excluded.events, quantity = r.quantity + excluded.quantity,
        amount_cents = r.amount_cents + excluded.amount_cents
    RETURNING customer_id, period
)
SELECT DISTINCT customer_id, period FROM upsert ORDER BY 1, 2`, planFresh, fromEvent, toEvent, fromVoid, toVoid)
	if err != nil {
		return nil, fmt.Errorf("error adding events (%d, %d] and voids (%d, %d] to the roll-ups: %w",
			fromEvent, toEvent, fromVoid, toVoid, err)
	}
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (periodKey, error) {
		var k periodKey
		return k, row.Scan(&k.customerID, &k.period)
	})
	if err != nil {
		return nil, fmt.Errorf("error adding events (%d, %d] and voids (%d, %d] to the roll-ups: %w",
			fromEvent, toEvent, fromVoid, toVoid, err)
	}
	return keys, nil
}

// rollupUsage reads what the roll-ups of keys come to, in the shape the
// close's periodUsageTx gives: the pre-priced events' count and total, and
// each metric's count and net quantity (a metric whose events were all
// voided is left out, as the close leaves it out). A key without roll-ups
// is absent.
func rollupUsage(ctx context.Context, tx *Tx, keys []periodKey) (map[periodKey]*periodUsage, error) {
	customers, periods := splitKeys(keys)
	rows, err := tx.Query(ctx, `
SELECT r.customer_id, r.period, r.metric, sum(r.events)::bigint, sum(r.quantity)::text, sum(r.amount_cents)::bigint
FROM unnest($1::text[], $2::text[]) AS k (customer_id, period)
JOIN billing.usage_rollups r ON r.customer_id = k.customer_id AND r.period = k.period
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3`, planFresh, customers, periods)
	if err != nil {
		return nil, fmt.Errorf("error reading the roll-ups: %w", err)
	}
	usage := map[periodKey]*periodUsage{}
	var k periodKey
	var metric, quantity string
	var events, cents int64
	_, err = pgx.ForEachRow(rows, []any{&k.customerID, &k.period, &metric, &events, &quantity, &cents}, func() error {
		u := usage[k]
		if u == nil {
			u = &periodUsage{}
			usage[k] = u
		}
		if events == 0 {
			return nil
		}
		u.events += events
		if metric == "" {
			u.prePriced, u.prePricedCents = events, cents
			return nil
		}
		q, err := quantityOf(quantity)
		if err != nil {
			return err
		}
		u.metrics = append(u.metrics, metricUsage{metric: metric, events: events, quantity: *q})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error reading the roll-ups: %w", err)
	}
	return usage, nil
}

// usageThresholdsRatedTx rates the roll-ups of each open period of keys
// whose customer has a usage threshold the period has not reached yet, and
// records those its rated total (pre-priced events included, carried
// amounts not) reached; and, for a customer whose automatic recharge is
// armed, starts it when that total projects its credit balance below the
// threshold (rechargeCheckTx). A period the plan cannot rate is logged and
// left for the close, which fails loudly on it.
func (l *Ledger) usageThresholdsRatedTx(ctx context.Context, tx *Tx, now time.Time, keys []periodKey) (int, error) {
	customers, periods := splitKeys(keys)
	rows, err := tx.Query(ctx, `
SELECT p.customer_id, p.period, p.currency, p.plan_id, p.plan_version, v.price_book,
       c.recharge_armed AND c.recharge_below_cents IS NOT NULL AND c.currency = p.currency
FROM unnest($1::text[], $2::text[]) AS k (customer_id, period)
JOIN billing.periods p ON p.customer_id = k.customer_id AND p.period = k.period
JOIN billing.customers c ON c.customer_id = p.customer_id
LEFT JOIN billing.plan_versions v ON v.plan_id = p.plan_id AND v.version = p.plan_version
WHERE p.status = 'open'
  AND (EXISTS (SELECT 1 FROM unnest(c.usage_alert_thresholds_cents) AS t (threshold_cents)
               WHERE NOT EXISTS (SELECT 1 FROM billing.usage_thresholds_reached r
                                 WHERE r.customer_id = p.customer_id AND r.period = p.period
                                   AND r.threshold_cents = t.threshold_cents))
       OR (c.recharge_armed AND c.recharge_below_cents IS NOT NULL AND c.currency = p.currency))
ORDER BY 1, 2`, customers, periods)
	if err != nil {
		return 0, fmt.Errorf("error finding the periods with thresholds to check: %w", err)
	}
	type candidate struct {
		key      periodKey
		currency string
		plan     periodPlan
		recharge bool
	}
	var candidates []candidate
	var c candidate
	var planID *string
	var planVersion *int32
	var book []byte
	_, err = pgx.ForEachRow(rows, []any{&c.key.customerID, &c.key.period, &c.currency, &planID, &planVersion, &book, &c.recharge}, func() error {
		c.plan = periodPlan{}
		if planID != nil && planVersion != nil && book != nil {
			c.plan = periodPlan{id: *planID, version: *planVersion, book: append([]byte(nil), book...)}
		}
		candidates = append(candidates, c)
		return nil
	})
	if err != nil || len(candidates) == 0 {
		if err != nil {
			err = fmt.Errorf("error finding the periods with thresholds to check: %w", err)
		}
		return 0, err
	}
	check := make([]periodKey, len(candidates))
	for i, c := range candidates {
		check[i] = c.key
	}
	usage, err := rollupUsage(ctx, tx, check)
	if err != nil {
		return 0, err
	}
	totals := make([]periodTotal, 0, len(candidates))
	for _, c := range candidates {
		u := usage[c.key]
		if u == nil {
			continue
		}
		_, total, err := rateLines(*u, c.plan, 0)
		if err != nil {
			l.logger.ErrorContext(ctx, "usage thresholds not checked: the period cannot be rated",
				slog.String("customer_id", c.key.customerID), slog.String("period", c.key.period),
				slog.String("error", err.Error()))
			continue
		}
		totals = append(totals, periodTotal{key: c.key, currency: c.currency, totalCents: total})
		if c.recharge {
			if _, err := l.rechargeCheckTx(ctx, tx, now, c.key.customerID, "usage_rollup", total); err != nil {
				return 0, err
			}
		}
	}
	if len(totals) == 0 {
		return 0, nil
	}
	return usageThresholdsRecordTx(tx, now, totals).get(ctx)
}

// splitKeys returns the customers and periods of keys, as two arrays for
// unnest.
func splitKeys(keys []periodKey) (customers, periods []string) {
	customers, periods = make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		customers[i], periods[i] = k.customerID, k.period
	}
	return customers, periods
}
