package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cadence is the length of a billing period.
type Cadence string

// Cadences. CadenceDefault is the one used when none is configured.
const (
	CadenceMonth   Cadence = "month"
	CadenceDay     Cadence = "day"
	CadenceHour    Cadence = "hour"
	CadenceDefault         = CadenceMonth
)

// ParseCadence returns the Cadence named s, or an error listing the valid ones.
func ParseCadence(s string) (Cadence, error) {
	switch c := Cadence(s); c {
	case CadenceMonth, CadenceDay, CadenceHour:
		return c, nil
	}
	return "", fmt.Errorf("unknown cadence %q: want month, day or hour", s)
}

func (c Cadence) layout() string {
	switch c {
	case CadenceDay:
		return "2006-01-02"
	case CadenceHour:
		return "2006-01-02T15"
	default:
		return "2006-01"
	}
}

// Bounds is one billing period: its label and its half-open UTC interval
// [StartsAt, EndsAt).
type Bounds struct {
	Label    string
	StartsAt time.Time
	EndsAt   time.Time
}

// Bounds returns the period that contains t.
func (c Cadence) Bounds(t time.Time) Bounds {
	t = t.UTC()
	var start, end time.Time
	switch c {
	case CadenceDay:
		start = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		end = start.AddDate(0, 0, 1)
	case CadenceHour:
		start = t.Truncate(time.Hour)
		end = start.Add(time.Hour)
	default:
		start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		end = start.AddDate(0, 1, 0)
	}
	return Bounds{Label: start.Format(c.layout()), StartsAt: start, EndsAt: end}
}

// ParseLabel returns the period named label (2026-11, 2026-11-30 or
// 2026-11-30T13, by cadence), or an error showing an example of the expected
// form (never the Go layout, which reads as a date of 2006).
func (c Cadence) ParseLabel(label string) (Bounds, error) {
	t, err := time.Parse(c.layout(), label)
	if err != nil || t.Format(c.layout()) != label {
		return Bounds{}, fmt.Errorf("period %q is not a %s period: want a label such as %s", label, c, c.Bounds(labelExample).Label)
	}
	return c.Bounds(t), nil
}

// labelExample is the time whose period labels messages show as examples:
// 2026-12, 2026-12-03, 2026-12-03T17.
var labelExample = time.Date(2026, 12, 3, 17, 4, 5, 0, time.UTC)

// Period statuses.
const (
	PeriodOpen   = "open"
	PeriodClosed = "closed"
)

// Period is a customer's billing period with its running totals.
type Period struct {
	CustomerID  string
	Period      string
	Currency    string
	Status      string
	StartsAt    time.Time
	EndsAt      time.Time
	ClosesAt    time.Time
	ClosedAt    *time.Time
	ChargeJobID *int64
	EventCount  int64
	TotalCents  int64

	// PlanID and PlanVersion are the customer's plan and its version in
	// force when the period opened, which price it; nil: none.
	PlanID      *string
	PlanVersion *int32

	// ChargeID and ChargeStatus are set once the period has closed.
	ChargeID     *int64
	ChargeStatus *string
}

// periodSelectSQL reads periods with their event counts and totals; every
// caller appends a WHERE on p.customer_id = $1. The sums name $1, not
// p.customer_id: the planner then prunes the partitioned ledger to the
// customer's partition for each period, where a correlated customer_id left
// each period's sum estimated over all sixteen, and a page of a few hundred
// periods past jit_above_cost (200 ms of JIT for 300 periods against 3 ms).
const periodSelectSQL = `
SELECT p.customer_id, p.period, p.currency, p.status, p.starts_at, p.ends_at, p.closes_at,
       p.closed_at, p.charge_job_id, p.plan_id, p.plan_version,
       (SELECT count(*) FROM billing.usage_events_counted e
         WHERE e.customer_id = $1 AND e.period = p.period),
       (SELECT coalesce(sum(e.amount_cents), 0)::bigint FROM billing.usage_events_counted e
         WHERE e.customer_id = $1 AND e.period = p.period),
       c.id, c.status
FROM billing.periods p
LEFT JOIN billing.charges c ON c.customer_id = p.customer_id AND c.period = p.period`

func scanPeriod(row pgx.Row) (*Period, error) {
	var p Period
	err := row.Scan(&p.CustomerID, &p.Period, &p.Currency, &p.Status, &p.StartsAt, &p.EndsAt,
		&p.ClosesAt, &p.ClosedAt, &p.ChargeJobID, &p.PlanID, &p.PlanVersion, &p.EventCount, &p.TotalCents, &p.ChargeID, &p.ChargeStatus)
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// PeriodGet returns one period of a customer with its event count and total.
// It returns ErrNotFound when the customer has no such period.
func (l *Ledger) PeriodGet(ctx context.Context, customerID, period string) (*Period, error) {
	if !ValidID(customerID) || !ValidID(period) {
		return nil, notFound("period %s of customer %q", period, customerID)
	}
	p, err := scanPeriod(l.pool.QueryRow(ctx, periodSelectSQL+`
WHERE p.customer_id = $1 AND p.period = $2`, customerID, period))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("period %s of customer %q", period, customerID)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading period %s/%s: %w", customerID, period, err)
	}
	return p, nil
}

// PeriodListLimitDefault and PeriodListLimitMax bound a page of
// PeriodListPage.
const (
	PeriodListLimitDefault = 50
	PeriodListLimitMax     = 500
)

// PeriodListParams select and page PeriodListPage.
type PeriodListParams struct {
	CustomerID string

	// StartingAfter is the cursor: the label of the last period of the
	// previous page (its next_cursor). Only older periods follow it.
	// Empty: from the newest.
	StartingAfter string

	// Limit is the page size. Default PeriodListLimitDefault, at most
	// PeriodListLimitMax.
	Limit int
}

// periodListOrder is the order of a customer's periods: newest first, and
// periods that start together (a month and its first day, after a change of
// cadence) by label, descending.
const periodListOrder = `
ORDER BY p.starts_at DESC, p.period DESC`

// PeriodList returns all of a customer's periods, newest first. It returns
// ErrNotFound when the customer does not exist. PeriodListPage pages them.
func (l *Ledger) PeriodList(ctx context.Context, customerID string) ([]*Period, error) {
	if _, err := l.CustomerGet(ctx, customerID); err != nil {
		return nil, err
	}
	rows, err := l.pool.Query(ctx, periodSelectSQL+`
WHERE p.customer_id = $1`+periodListOrder, customerID)
	if err != nil {
		return nil, fmt.Errorf("error listing periods of %s: %w", customerID, err)
	}
	periods, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Period, error) { return scanPeriod(r) })
	if err != nil {
		return nil, fmt.Errorf("error listing periods of %s: %w", customerID, err)
	}
	return periods, nil
}

// PeriodListPage returns one page of a customer's periods, newest first, and
// whether more follow; pass the last period's label as StartingAfter for the
// next page. It reads without a transaction, so a period created between two
// pages appears on the first page, not in the middle. It returns ErrNotFound
// when the customer does not exist, and a *ValidationError naming limit or
// starting_after (which must be a period label of any cadence: 2026-11,
// 2026-11-30 or 2026-11-30T13).
func (l *Ledger) PeriodListPage(ctx context.Context, p PeriodListParams) ([]*Period, bool, error) {
	fe := fieldErrors{}
	if p.Limit < 0 || p.Limit > PeriodListLimitMax {
		fe.add("limit", "must be between 1 and %d", PeriodListLimitMax)
	}
	var after *time.Time
	if p.StartingAfter != "" {
		b, ok := parseAnyLabel(p.StartingAfter)
		if !ok {
			fe.add("starting_after", "must be the next_cursor of a previous page, a period label such as 2026-11")
		}
		after = &b.StartsAt
	}
	if err := fe.err(); err != nil {
		return nil, false, err
	}
	if p.Limit == 0 {
		p.Limit = PeriodListLimitDefault
	}
	if _, err := l.CustomerGet(ctx, p.CustomerID); err != nil {
		return nil, false, err
	}
	rows, err := l.pool.Query(ctx, periodSelectSQL+`
WHERE p.customer_id = $1
  AND ($2::timestamptz IS NULL OR (p.starts_at, p.period) < ($2, $3))`+periodListOrder+`
LIMIT $4`, p.CustomerID, after, p.StartingAfter, p.Limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("error listing periods of %s: %w", p.CustomerID, err)
	}
	periods, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Period, error) { return scanPeriod(r) })
	if err != nil {
		return nil, false, fmt.Errorf("error listing periods of %s: %w", p.CustomerID, err)
	}
	more := len(periods) > p.Limit
	if more {
		periods = periods[:p.Limit]
	}
	return periods, more, nil
}

// parseAnyLabel parses a period label of any cadence; a period's label names
// its start, whatever the cadence configured now.
func parseAnyLabel(label string) (Bounds, bool) {
	for _, c := range []Cadence{CadenceMonth, CadenceDay, CadenceHour} {
		if b, err := c.ParseLabel(label); err == nil {
			return b, true
		}
	}
	return Bounds{}, false
}
