package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/apd/v3"
	"github.com/jackc/pgx/v5"
)

// The usage API's reads (GET /v1/customers/{id}/usage and .../usage/series)
// answer from the roll-ups (usage_rollup.go), never from the events: what a
// period comes to so far, rated with its plan version, and quantities per
// hour or day. They lag ingest by as much as the roll-ups do (AsOf).

// CustomerUsage is a customer's usage in one period so far, rated.
type CustomerUsage struct {
	CustomerID string
	Period     Bounds
	// Status is the period's (open or closed); open for a period that has
	// no events yet.
	Status   string
	Currency string
	// PlanID and PlanVersion are the plan version that prices the period
	// (for a period not opened yet, the one it would open with); nil: none.
	PlanID      *string
	PlanVersion *int32
	// Metrics are the quantity events' metrics, each rated on its own.
	Metrics []MetricUsage
	// PrePricedEvents and PrePricedCents are the events that came with
	// amount_cents.
	PrePricedEvents int64
	PrePricedCents  int64
	// CarriedCents is what earlier charges carried forward add to the
	// period's charge: those not yet billed (open period) or those its
	// charge billed (closed).
	CarriedCents int64
	// ProjectedCents is the charge the period comes to so far: its lines'
	// sum, as the close would rate them now.
	ProjectedCents int64
	// ChargeID is the period's charge, once closed.
	ChargeID *int64
	// AsOf is when the roll-ups last moved: events committed since may be
	// missing.
	AsOf time.Time
}

// MetricUsage is one metric's usage in a period, rated.
type MetricUsage struct {
	Metric      string
	Events      int64
	Quantity    apd.Decimal
	Model       string
	ExactAmount apd.Decimal
	AmountCents int64
}

// CustomerUsageGet returns what customerID's period (a label; "" for the
// period open now) comes to so far, from the roll-ups. It returns a
// *NotFoundError for an unknown customer and a *ValidationError for a
// label that is not one of the configured cadence.
func (l *Ledger) CustomerUsageGet(ctx context.Context, customerID, period string) (*CustomerUsage, error) {
	var b Bounds
	if period == "" {
		b = l.config.Cadence.Bounds(l.now())
	} else {
		var err error
		if b, err = l.config.Cadence.ParseLabel(period); err != nil {
			return nil, &ValidationError{Fields: map[string]string{"period": err.Error()}}
		}
	}
	if !ValidID(customerID) {
		return nil, notFound("customer %q", customerID)
	}
	u := &CustomerUsage{CustomerID: customerID, Period: b, Status: PeriodOpen}
	err := l.withTx(ctx, func(tx *Tx) error {
		var status *string
		var book []byte
		err := tx.QueryRow(ctx, `
SELECT coalesce(p.currency, c.currency), p.status, pl.plan_id, pl.version, v.price_book, ch.id,
       CASE WHEN ch.id IS NOT NULL THEN ch.carried_in_cents
            ELSE (SELECT coalesce(sum(cf.amount_cents), 0) FROM billing.charges cf
                  WHERE cf.customer_id = c.customer_id AND cf.currency = coalesce(p.currency, c.currency)
                    AND cf.status = 'carried_forward' AND cf.carried_into IS NULL) END::bigint,
       (SELECT rolled_at FROM billing.usage_rollup_watermark)
FROM billing.customers c
LEFT JOIN billing.periods p ON p.customer_id = c.customer_id AND p.period = $2
CROSS JOIN LATERAL (
    SELECT coalesce(p.plan_id, c.plan_id) AS plan_id,
           CASE WHEN p.customer_id IS NOT NULL THEN p.plan_version
                ELSE (SELECT max(pv.version) FROM billing.plan_versions pv WHERE pv.plan_id = c.plan_id) END AS version
) pl
LEFT JOIN billing.plan_versions v ON v.plan_id = pl.plan_id AND v.version = pl.version
LEFT JOIN billing.charges ch ON ch.customer_id = c.customer_id AND ch.period = $2
WHERE c.customer_id = $1`, customerID, b.Label).Scan(&u.Currency, &status, &u.PlanID, &u.PlanVersion, &book, &u.ChargeID,
			&u.CarriedCents, &u.AsOf)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("customer %q", customerID)
		}
		if err != nil {
			return fmt.Errorf("error reading customer: %w", err)
		}
		if status != nil {
			u.Status = *status
		}
		var plan periodPlan
		if u.PlanID != nil && u.PlanVersion != nil && book != nil {
			plan = periodPlan{id: *u.PlanID, version: *u.PlanVersion, book: book}
		}
		key := periodKey{customerID, b.Label}
		usage, err := rollupUsage(ctx, tx, []periodKey{key})
		if err != nil {
			return err
		}
		pu := periodUsage{}
		if usage[key] != nil {
			pu = *usage[key]
		}
		lines, total, err := rateLines(pu, plan, u.CarriedCents)
		if err != nil {
			return fmt.Errorf("error rating period %s: %w", b.Label, err)
		}
		u.ProjectedCents = total
		u.PrePricedEvents, u.PrePricedCents = pu.prePriced, pu.prePricedCents
		for _, line := range lines {
			if line.Usage == nil {
				continue
			}
			u.Metrics = append(u.Metrics, MetricUsage{Metric: line.Usage.Metric, Events: line.EventCount,
				Quantity: line.Usage.Rated.Quantity, Model: string(line.Usage.Rated.Model),
				ExactAmount: line.ExactAmount, AmountCents: line.AmountCents})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error reading usage of %s/%s: %w", customerID, b.Label, err)
	}
	return u, nil
}

// Usage series granularities.
const (
	GranularityHour = "hour"
	GranularityDay  = "day"
)

// UsageSeriesBucketsMax bounds the buckets of one usage series.
const UsageSeriesBucketsMax = 1000

// UsageSeriesParams select a usage series.
type UsageSeriesParams struct {
	CustomerID string
	// Metric is a quantity metric, or "" for the pre-priced events.
	Metric string
	// From and To bound the series, [From, To), by the events' occurred_at;
	// zero: the open period's start and end. From is truncated, and To
	// rounded up, to Granularity, in UTC.
	From, To time.Time
	// Granularity is GranularityHour or GranularityDay (default).
	Granularity string
}

// UsageSeries is a metric's usage per bucket.
type UsageSeries struct {
	CustomerID  string
	Metric      string
	Granularity string
	From, To    time.Time
	Buckets     []UsageBucket
	AsOf        time.Time
}

// UsageBucket is one hour's or day's usage: its events, their net quantity
// (quantity metrics) and their amount (pre-priced events).
type UsageBucket struct {
	Start       time.Time
	Events      int64
	Quantity    apd.Decimal
	AmountCents int64
}

// CustomerUsageSeries returns p.Metric's usage per bucket, every bucket of
// [From, To) listed (empty ones with zeros), from the roll-ups. It returns
// a *ValidationError naming the field for a bad metric, granularity or
// range (at most UsageSeriesBucketsMax buckets), and a *NotFoundError for
// an unknown customer.
func (l *Ledger) CustomerUsageSeries(ctx context.Context, p UsageSeriesParams) (*UsageSeries, error) {
	fe := fieldErrors{}
	if p.Metric != "" {
		checkID(fe, "metric", p.Metric, false)
	}
	step := 24 * time.Hour
	switch p.Granularity {
	case "", GranularityDay:
		p.Granularity = GranularityDay
	case GranularityHour:
		step = time.Hour
	default:
		fe.add("granularity", "must be hour or day; got %q", p.Granularity)
	}
	if p.From.IsZero() || p.To.IsZero() {
		open := l.config.Cadence.Bounds(l.now())
		if p.From.IsZero() {
			p.From = open.StartsAt
		}
		if p.To.IsZero() {
			p.To = open.EndsAt
		}
	}
	from, to := p.From.UTC().Truncate(step), p.To.UTC()
	if !to.Truncate(step).Equal(to) {
		to = to.Truncate(step).Add(step)
	}
	switch {
	case !from.Before(to):
		fe.add("to", "must be after from (%s); got %s", p.From.Format(time.RFC3339), p.To.Format(time.RFC3339))
	case to.Sub(from)/step > UsageSeriesBucketsMax:
		fe.add("to", "makes %d %s buckets from %s; ask for at most %d (a shorter range, or granularity=day)",
			to.Sub(from)/step, p.Granularity, from.Format(time.RFC3339), UsageSeriesBucketsMax)
	}
	if err := fe.err(); err != nil {
		return nil, err
	}
	if !ValidID(p.CustomerID) {
		return nil, notFound("customer %q", p.CustomerID)
	}
	s := &UsageSeries{CustomerID: p.CustomerID, Metric: p.Metric, Granularity: p.Granularity, From: from, To: to}
	err := l.withTx(ctx, func(tx *Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM billing.customers WHERE customer_id = $1), (SELECT rolled_at FROM billing.usage_rollup_watermark)`,
			p.CustomerID).Scan(&exists, &s.AsOf); err != nil {
			return fmt.Errorf("error reading customer: %w", err)
		}
		if !exists {
			return notFound("customer %q", p.CustomerID)
		}
		rows, err := tx.Query(ctx, `
SELECT date_trunc($5, bucket_start, 'UTC'), sum(events)::bigint, sum(quantity)::text, sum(amount_cents)::bigint
FROM billing.usage_rollups
WHERE customer_id = $1 AND metric = $2 AND bucket_start >= $3 AND bucket_start < $4
GROUP BY 1
ORDER BY 1`, planFresh, p.CustomerID, p.Metric, from, to, p.Granularity)
		if err != nil {
			return fmt.Errorf("error reading the roll-ups: %w", err)
		}
		found := map[time.Time]UsageBucket{}
		var bk UsageBucket
		var quantity string
		if _, err := pgx.ForEachRow(rows, []any{&bk.Start, &bk.Events, &quantity, &bk.AmountCents}, func() error {
			q, err := quantityOf(quantity)
			if err != nil {
				return err
			}
			bk.Quantity.Set(q)
			found[bk.Start.UTC()] = bk
			return nil
		}); err != nil {
			return fmt.Errorf("error reading the roll-ups: %w", err)
		}
		s.Buckets = make([]UsageBucket, 0, to.Sub(from)/step)
		for t := from; t.Before(to); t = t.Add(step) {
			b, ok := found[t]
			if !ok {
				b = UsageBucket{}
			}
			b.Start = t
			s.Buckets = append(s.Buckets, b)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error reading the usage series of %s: %w", p.CustomerID, err)
	}
	return s, nil
}
