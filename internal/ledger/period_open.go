package ledger

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// periodsOpenTx makes sure each (customer, period) of events exists and is
// open, and holds it FOR KEY SHARE until tx ends. Periods are visited in
// sorted order so concurrent batches take their locks in the same order. A
// period is created, with its charge job, only by the transaction whose
// INSERT wins; the unique charge job is the second guard. It sets each
// event's periodCurrency, and returns the error of each (customer, period)
// that cannot take events.
func (l *Ledger) periodsOpenTx(ctx context.Context, tx pgx.Tx, now time.Time, events []*preparedEvent) (map[periodKey]error, error) {
	byPeriod := map[periodKey][]*preparedEvent{}
	for _, ev := range events {
		k := periodKey{ev.CustomerID, ev.periodBound.Label}
		byPeriod[k] = append(byPeriod[k], ev)
	}
	keys := make([]periodKey, 0, len(byPeriod))
	for k := range byPeriod {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].customerID != keys[j].customerID {
			return keys[i].customerID < keys[j].customerID
		}
		return keys[i].period < keys[j].period
	})

	errs := map[periodKey]error{}
	customerCurrency := map[string]string{}
	for _, k := range keys {
		bounds := byPeriod[k][0].periodBound
		currency, ok := customerCurrency[k.customerID]
		if !ok {
			err := tx.QueryRow(ctx, `SELECT currency FROM billing.customers WHERE customer_id = $1`, k.customerID).Scan(&currency)
			if err == pgx.ErrNoRows {
				errs[k] = &ValidationError{Fields: map[string]string{"customer_id": fmt.Sprintf(
					"unknown customer %q: create it with PUT /v1/customers/{customer_id} first", k.customerID)}}
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("error reading customer %s: %w", k.customerID, err)
			}
			customerCurrency[k.customerID] = currency
		}

		closesAt := bounds.EndsAt.Add(l.config.CloseGrace)
		if now.Before(closesAt) {
			if err := l.periodCreateTx(ctx, tx, now, k, bounds, closesAt, currency); err != nil {
				return nil, err
			}
		}

		var status, periodCurrency string
		err := tx.QueryRow(ctx, `
SELECT status, currency, closes_at FROM billing.periods
WHERE customer_id = $1 AND period = $2
FOR KEY SHARE`, k.customerID, k.period).Scan(&status, &periodCurrency, &closesAt)
		switch {
		case err == pgx.ErrNoRows || (err == nil && (status != PeriodOpen || !now.Before(closesAt))):
			errs[k] = &ConflictError{Code: ConflictPeriodClosed, Detail: fmt.Sprintf(
				"period %s of customer %s closed at %s and its charge is computed; "+
					"events for it can no longer be added", k.period, k.customerID, closesAt.Format(time.RFC3339))}
			continue
		case err != nil:
			return nil, fmt.Errorf("error locking period %s/%s: %w", k.customerID, k.period, err)
		}
		for _, ev := range byPeriod[k] {
			ev.periodCurrency = periodCurrency
		}
	}
	return errs, nil
}

// periodCreateTx inserts the period row unless it exists and, only when this
// transaction created it, inserts its charge job scheduled at closesAt and
// records the job's id on the row.
func (l *Ledger) periodCreateTx(ctx context.Context, tx pgx.Tx, now time.Time, k periodKey, b Bounds, closesAt time.Time, currency string) error {
	tag, err := tx.Exec(ctx, `
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (customer_id, period) DO NOTHING`,
		k.customerID, k.period, currency, b.StartsAt, b.EndsAt, closesAt, now)
	if err != nil {
		return fmt.Errorf("error creating period %s/%s: %w", k.customerID, k.period, err)
	}
	if tag.RowsAffected() == 0 {
		return nil
	}
	if l.config.Scheduler == nil {
		return fmt.Errorf("error creating period %s/%s: ledger has no Scheduler", k.customerID, k.period)
	}
	jobID, err := l.config.Scheduler.ChargeJobInsertTx(ctx, tx, k.customerID, k.period, closesAt)
	if err != nil {
		return fmt.Errorf("error inserting charge job of period %s/%s: %w", k.customerID, k.period, err)
	}
	if _, err := tx.Exec(ctx, `
UPDATE billing.periods SET charge_job_id = $3 WHERE customer_id = $1 AND period = $2`,
		k.customerID, k.period, jobID); err != nil {
		return fmt.Errorf("error recording charge job of period %s/%s: %w", k.customerID, k.period, err)
	}
	return nil
}
