package ledger

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// periodsOpenTx makes sure each (customer, period) of events exists and is
// open, and holds it FOR KEY SHARE until tx ends. The periods that exist are
// locked in one statement, in sorted order; the missing ones are then created
// and locked one by one, in sorted order too, so concurrent batches never
// wait for each other in a cycle. A period is created, with its charge job,
// only by the transaction whose INSERT wins; the unique charge job is the
// second guard. It sets each event's periodCurrency and periodPlan, and
// periodPriced for a quantity event whose metric the period's plan version
// prices, and returns the error of each (customer, period) that cannot take
// events.
func (l *Ledger) periodsOpenTx(ctx context.Context, tx *Tx, now time.Time, events []*preparedEvent) (map[periodKey]error, error) {
	byPeriod := map[periodKey][]*preparedEvent{}
	var wanted []metricKey
	for _, ev := range events {
		k := periodKey{ev.CustomerID, ev.periodBound.Label}
		byPeriod[k] = append(byPeriod[k], ev)
		if ev.quantity != "" {
			wanted = append(wanted, metricKey{k, ev.Metric})
		}
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

	locked, err := periodsLockTx(ctx, tx, keys, wanted)
	if err != nil {
		return nil, err
	}
	errs := map[periodKey]error{}
	for _, k := range keys {
		state, ok := locked[k]
		if !ok {
			if state, err = l.periodCreateLockTx(ctx, tx, now, k, byPeriod[k][0].periodBound, wanted); err != nil {
				var ve *ValidationError
				if errors.As(err, &ve) {
					errs[k] = ve
					continue
				}
				return nil, err
			}
		}
		if state == nil || state.status != PeriodOpen || !now.Before(state.closesAt) {
			errs[k] = periodClosedError(k, state, byPeriod[k][0].periodBound.EndsAt.Add(l.config.CloseGrace), now)
			continue
		}
		for _, ev := range byPeriod[k] {
			ev.periodCurrency, ev.periodPlan = state.currency, state.plan
			ev.periodPriced = ev.quantity != "" && state.priced[ev.Metric]
		}
	}
	return errs, nil
}

// periodClosedError is the period_closed conflict of an event for period k,
// whose row is state (nil: never created, its close time closesAt passed),
// at now. It says when the period really stopped taking events (its
// closed_at; else its close time) and how to bill the event instead: no
// usage can be added to a closed period (there is no adjustment of a
// computed charge), so the event goes into an open one, whose charge counts
// it.
func periodClosedError(k periodKey, state *periodState, closesAt, now time.Time) *ConflictError {
	var when string
	switch {
	case state == nil:
		when = fmt.Sprintf("stopped taking events at %s (its end plus the close grace); it has no events and no charge",
			closesAt.Format(time.RFC3339))
	case state.closedAt != nil:
		when = fmt.Sprintf("was closed at %s and its charge is computed", state.closedAt.Format(time.RFC3339))
	default:
		when = fmt.Sprintf("stopped taking events at its close time, %s, and is being closed and charged",
			state.closesAt.Format(time.RFC3339))
	}
	return &ConflictError{Code: ConflictPeriodClosed, Detail: fmt.Sprintf(
		"period %s of customer %s %s; events for it can no longer be added. To bill this usage, post the event "+
			"again with an occurred_at in a period still open, such as now (%s), or without occurred_at (it "+
			"defaults to now): that period's charge counts it", k.period, k.customerID, when, now.Format(time.RFC3339))}
}

// periodState is a period row as ingest reads it under its lock.
type periodState struct {
	status, currency string
	closesAt         time.Time
	closedAt         *time.Time // set once closed
	plan             planRef

	// priced holds the metrics asked about (periodsLockTx's wanted) that
	// the period's plan version prices.
	priced map[string]bool
}

// planRef is a plan version a period is priced with; ID nil for none.
type planRef struct {
	ID      *string
	Version *int32
}

// metricKey is a metric asked about in a period: does its plan version
// price it?
type metricKey struct {
	periodKey
	metric string
}

// periodsLockTx locks FOR KEY SHARE, in (customer, period) byte order, the
// periods among keys that exist, and returns them, each with the metrics of
// wanted (its own) that its plan version prices. It runs planFresh, so
// Postgres plans it for the table's size of the day, never with a plan
// cached while the table was empty.
func periodsLockTx(ctx context.Context, tx *Tx, keys []periodKey, wanted []metricKey) (map[periodKey]*periodState, error) {
	customers := make([]string, len(keys))
	periods := make([]string, len(keys))
	for i, k := range keys {
		customers[i], periods[i] = k.customerID, k.period
	}
	wantedCustomers, wantedPeriods, wantedMetrics := make([]string, len(wanted)), make([]string, len(wanted)), make([]string, len(wanted))
	for i, w := range wanted {
		wantedCustomers[i], wantedPeriods[i], wantedMetrics[i] = w.customerID, w.period, w.metric
	}
	rows, err := tx.Query(ctx, `
SELECT p.customer_id, p.period, p.status, p.currency, p.closes_at, p.closed_at, p.plan_id, p.plan_version,
       ARRAY(SELECT DISTINCT w.metric
             FROM unnest($3::text[], $4::text[], $5::text[]) AS w (customer_id, period, metric)
             JOIN billing.plan_prices pp ON pp.plan_id = p.plan_id AND pp.version = p.plan_version AND pp.metric = w.metric
             WHERE w.customer_id = p.customer_id AND w.period = p.period)
FROM unnest($1::text[], $2::text[]) AS k (customer_id, period)
JOIN billing.periods p ON p.customer_id = k.customer_id AND p.period = k.period
ORDER BY p.customer_id COLLATE "C", p.period COLLATE "C"
FOR KEY SHARE OF p`, planFresh, customers, periods, wantedCustomers, wantedPeriods, wantedMetrics)
	if err != nil {
		return nil, fmt.Errorf("error locking %d periods: %w", len(keys), err)
	}
	locked := make(map[periodKey]*periodState, len(keys))
	var k periodKey
	var st periodState
	var priced []string
	_, err = pgx.ForEachRow(rows, []any{&k.customerID, &k.period, &st.status, &st.currency, &st.closesAt, &st.closedAt,
		&st.plan.ID, &st.plan.Version, &priced}, func() error {
		s := st
		s.priced = make(map[string]bool, len(priced))
		for _, m := range priced {
			s.priced[m] = true
		}
		locked[k] = &s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error locking %d periods: %w", len(keys), err)
	}
	return locked, nil
}

// periodCreateLockTx creates period k of bounds b unless its close time has
// passed (with its charge job, when this transaction's insert wins), then
// locks it FOR KEY SHARE and returns it, or nil when it does not exist. It
// returns a *ValidationError when the customer is unknown.
func (l *Ledger) periodCreateLockTx(ctx context.Context, tx *Tx, now time.Time, k periodKey, b Bounds, wanted []metricKey) (*periodState, error) {
	open, err := periodOpeningTx(ctx, tx, k.customerID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &ValidationError{Fields: map[string]string{"customer_id": fmt.Sprintf(
			"unknown customer %q: create it with PUT /v1/customers/{customer_id} first", k.customerID)}}
	}
	if err != nil {
		return nil, fmt.Errorf("error reading customer %s: %w", k.customerID, err)
	}
	if closesAt := b.EndsAt.Add(l.config.CloseGrace); now.Before(closesAt) {
		if err := l.periodCreateTx(ctx, tx, now, k, b, closesAt, open); err != nil {
			return nil, err
		}
	}
	locked, err := periodsLockTx(ctx, tx, []periodKey{k}, wanted)
	if err != nil {
		return nil, err
	}
	return locked[k], nil
}

// periodOpening is what a new period takes from its customer when it opens:
// the currency, and the plan with its version then in force (nil: none).
type periodOpening struct {
	currency string
	plan     planRef
}

// periodOpeningTx reads what a new period of customerID takes from it;
// pgx.ErrNoRows when the customer is unknown.
func periodOpeningTx(ctx context.Context, tx *Tx, customerID string) (periodOpening, error) {
	var open periodOpening
	err := tx.QueryRow(ctx, `
SELECT c.currency, c.plan_id,
       (SELECT max(v.version) FROM billing.plan_versions v WHERE v.plan_id = c.plan_id)
FROM billing.customers c WHERE c.customer_id = $1`, customerID).Scan(&open.currency, &open.plan.ID, &open.plan.Version)
	return open, err
}

// periodCreateTx inserts the period row unless it exists and, only when this
// transaction created it, inserts its charge job scheduled at closesAt and
// records the job's id on the row.
func (l *Ledger) periodCreateTx(ctx context.Context, tx *Tx, now time.Time, k periodKey, b Bounds, closesAt time.Time, open periodOpening) error {
	tag, err := tx.Exec(ctx, `
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, created_at, plan_id, plan_version)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (customer_id, period) DO NOTHING`,
		k.customerID, k.period, open.currency, b.StartsAt, b.EndsAt, closesAt, now, open.plan.ID, open.plan.Version)
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
