package ledger

import (
	"context"
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
// 2026-11-30T13, by cadence), or an error showing the expected form.
func (c Cadence) ParseLabel(label string) (Bounds, error) {
	t, err := time.Parse(c.layout(), label)
	if err != nil || t.Format(c.layout()) != label {
		return Bounds{}, fmt.Errorf("period %q is not a %s period: want the form %s", label, c, c.layout())
	}
	return c.Bounds(t), nil
}

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

	// ChargeID and ChargeStatus are set once the period has closed.
	ChargeID     *int64
	ChargeStatus *string
}

const periodSelectSQL = `
SELECT p.customer_id, p.period, p.currency, p.status, p.starts_at, p.ends_at, p.closes_at,
       p.closed_at, p.charge_job_id,
       (SELECT count(*) FROM billing.usage_events e
         WHERE e.customer_id = p.customer_id AND e.period = p.period),
       (SELECT coalesce(sum(e.amount_cents), 0)::bigint FROM billing.usage_events e
         WHERE e.customer_id = p.customer_id AND e.period = p.period),
       c.id, c.status
FROM billing.periods p
LEFT JOIN billing.charges c ON c.customer_id = p.customer_id AND c.period = p.period`

func scanPeriod(row pgx.Row) (*Period, error) {
	var p Period
	err := row.Scan(&p.CustomerID, &p.Period, &p.Currency, &p.Status, &p.StartsAt, &p.EndsAt,
		&p.ClosesAt, &p.ClosedAt, &p.ChargeJobID, &p.EventCount, &p.TotalCents, &p.ChargeID, &p.ChargeStatus)
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// PeriodGet returns one period of a customer with its event count and total.
// It returns ErrNotFound when the customer has no such period.
func (l *Ledger) PeriodGet(ctx context.Context, customerID, period string) (*Period, error) {
	if !validID(customerID) || !validID(period) {
		return nil, fmt.Errorf("period %s of customer %q %w", period, customerID, ErrNotFound)
	}
	p, err := scanPeriod(l.pool.QueryRow(ctx, periodSelectSQL+`
WHERE p.customer_id = $1 AND p.period = $2`, customerID, period))
	if err == pgx.ErrNoRows {
		return nil, fmt.Errorf("period %s of customer %q %w", period, customerID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading period %s/%s: %w", customerID, period, err)
	}
	return p, nil
}

// PeriodList returns a customer's periods, newest first. It returns
// ErrNotFound when the customer does not exist.
func (l *Ledger) PeriodList(ctx context.Context, customerID string) ([]*Period, error) {
	if _, err := l.CustomerGet(ctx, customerID); err != nil {
		return nil, err
	}
	rows, err := l.pool.Query(ctx, periodSelectSQL+`
WHERE p.customer_id = $1
ORDER BY p.starts_at DESC`, customerID)
	if err != nil {
		return nil, fmt.Errorf("error listing periods of %s: %w", customerID, err)
	}
	periods, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Period, error) { return scanPeriod(r) })
	if err != nil {
		return nil, fmt.Errorf("error listing periods of %s: %w", customerID, err)
	}
	return periods, nil
}
