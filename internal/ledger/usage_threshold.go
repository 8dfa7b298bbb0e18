package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// UsageThresholdsMax bounds a customer's usage alert thresholds.
const UsageThresholdsMax = 20

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

// periodTotal is a period's rated total, for its thresholds: its usage
// lines and pre-priced events, without carried amounts.
type periodTotal struct {
	key        periodKey
	currency   string
	totalCents int64
}

// usageThresholdsRecordTx records, in one statement, every threshold of
// each total's customer that the total reached and that was not recorded
// before, each with its notice, and returns how many it recorded. The
// statement is sent with the transaction's next one: the notices are
// recorded then, long before the transaction writes their notifications.
func usageThresholdsRecordTx(tx *Tx, now time.Time, totals []periodTotal) *later[int] {
	n := len(totals)
	customers, periods, currencies, cents := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
	for i, t := range totals {
		customers[i], periods[i], currencies[i], cents[i] = t.key.customerID, t.key.period, t.currency, t.totalCents
	}
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
INSERT INTO billing.usage_thresholds_reached (customer_id, period, threshold_cents, total_cents, currency, reached_at)
SELECT k.customer_id, k.period, t.threshold_cents, k.total_cents, k.currency, $5
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS k (customer_id, period, currency, total_cents)
JOIN billing.customers c ON c.customer_id = k.customer_id
CROSS JOIN LATERAL unnest(c.usage_alert_thresholds_cents) AS t (threshold_cents)
WHERE t.threshold_cents <= k.total_cents
ON CONFLICT DO NOTHING
RETURNING customer_id, period, threshold_cents`, customers, periods, currencies, cents, now)
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

// usageThresholdsAtCloseTx records the thresholds that the closing
// period's rated total reached, whatever the roll-ups have told: the
// backstop that tells every threshold the period reached by its close at
// the latest. It goes with the transaction's next statement.
func usageThresholdsAtCloseTx(tx *Tx, now time.Time, customerID, period, currency string, totalCents int64) {
	usageThresholdsRecordTx(tx, now, []periodTotal{{key: periodKey{customerID, period}, currency: currency, totalCents: totalCents}})
}
