package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cockroachdb/apd/v3"
	"github.com/jackc/pgx/v5"

	"github.com/tally-billing/tally/internal/pricing"
)

// A charge is made of lines (billing.charge_lines), written with it at the
// close: one per metric of the period's quantity events, rated with the
// plan version the period opened with; one for the pre-priced events; one
// for earlier charges carried into it; one per credit grant applied, a
// negative amount. Its amount is the sum of their amounts, each rounded
// once (pricing.Rate).

// ChargeLineKind is what a line bills.
type ChargeLineKind string

// Line kinds, in the order a charge lists them.
const (
	// ChargeLineUsage is one metric's quantity events, rated by the plan.
	ChargeLineUsage ChargeLineKind = "usage"
	// ChargeLinePrePriced is the events that came with amount_cents.
	ChargeLinePrePriced ChargeLineKind = "pre_priced"
	// ChargeLineCarried is earlier charges carried forward into this one.
	ChargeLineCarried ChargeLineKind = "carried"
	// ChargeLineCredit is one grant's credits applied to the lines above: a
	// negative amount (credit_burn.go).
	ChargeLineCredit ChargeLineKind = "credit"
)

// ChargeLine is one line of a charge.
type ChargeLine struct {
	// Line numbers a charge's lines from 1, in the order above (usage lines
	// by metric).
	Line int32
	Kind ChargeLineKind
	// EventCount is the events behind the line (0 for carried).
	EventCount int64
	// ExactAmount is the line's exact amount in minor units; AmountCents
	// rounds it half-up (equal for pre_priced and carried).
	ExactAmount apd.Decimal
	AmountCents int64

	// Usage is the rating of a usage line; nil for the other kinds.
	Usage *UsageRating

	// GrantID is a credit line's grant; "" for the other kinds.
	GrantID string
}

// UsageRating is how a usage line was rated.
type UsageRating struct {
	Metric      string
	PlanID      string
	PlanVersion int32
	// Rated is pricing.Rate's line item: the model, the net quantity, the
	// tiers reached or packages started, the subtotal and the minimum.
	Rated pricing.LineItem
}

// metricUsage is one metric's quantity events in a period.
type metricUsage struct {
	metric   string
	events   int64
	quantity apd.Decimal
}

// periodUsage is what a closing period's events come to, unrated.
type periodUsage struct {
	events         int64 // every event
	prePriced      int64 // events with amount_cents
	prePricedCents int64
	metrics        []metricUsage // quantity events, by metric
}

// periodUsageTx reads the events of a closed period in one scan: the
// pre-priced ones' count and total, and each metric's quantity events'
// count and net quantity. The statement is sent with the transaction's next
// one.
func periodUsageTx(tx *Tx, customerID, period string) *later[periodUsage] {
	return queryLater(tx, func(rows pgx.Rows) (periodUsage, error) {
		var u periodUsage
		var metric, quantity *string
		var events, cents int64
		_, err := pgx.ForEachRow(rows, []any{&metric, &events, &cents, &quantity}, func() error {
			u.events += events
			if metric == nil {
				u.prePriced, u.prePricedCents = events, cents
				return nil
			}
			if quantity == nil {
				return fmt.Errorf("metric %q has quantity events without a quantity", *metric)
			}
			q, err := quantityOf(*quantity)
			if err != nil {
				return err
			}
			u.metrics = append(u.metrics, metricUsage{metric: *metric, events: events, quantity: *q})
			return nil
		})
		if err != nil {
			return periodUsage{}, fmt.Errorf("error summing period: %w", err)
		}
		return u, nil
	}, `
SELECT CASE WHEN amount_cents IS NULL THEN metric END, count(*),
       coalesce(sum(amount_cents), 0)::bigint, sum(quantity) FILTER (WHERE amount_cents IS NULL)::text
FROM billing.usage_events_counted
WHERE customer_id = $1 AND period = $2
GROUP BY 1
ORDER BY 1 NULLS FIRST`, customerID, period)
}

// periodPlan is the plan version a period opened with.
type periodPlan struct {
	id      string
	version int32
	book    []byte // the version's price_book; nil for a period without a plan
}

// rateLines rates u under plan and returns the charge's lines and their
// total: a usage line per metric, then the pre-priced line (when the
// period has pre-priced events) and the carried line (when carried > 0). A
// quantity event's metric without a price in the period's plan version is
// an error: ingest refuses such an event, so one here means the ledger is
// inconsistent, and the close must not guess.
func rateLines(u periodUsage, plan periodPlan, carried int64) ([]ChargeLine, int64, error) {
	var lines []ChargeLine
	var total int64
	add := func(l ChargeLine) error {
		if l.AmountCents > math.MaxInt64-total {
			return fmt.Errorf("the charge's lines add up to more than %d minor units", int64(math.MaxInt64))
		}
		l.Line = int32(len(lines) + 1)
		lines, total = append(lines, l), total+l.AmountCents
		return nil
	}
	if len(u.metrics) > 0 {
		if plan.book == nil {
			return nil, 0, fmt.Errorf("the period has quantity events of %q but no plan", u.metrics[0].metric)
		}
		book, err := pricing.ParsePlan(plan.book)
		if err != nil {
			return nil, 0, fmt.Errorf("error reading version %d of plan %s: %w", plan.version, plan.id, err)
		}
		for _, m := range u.metrics {
			price, ok := book.Prices[m.metric]
			if !ok {
				return nil, 0, fmt.Errorf("the period has quantity events of %q, which version %d of plan %s does not price",
					m.metric, plan.version, plan.id)
			}
			rated, err := pricing.Rate(price, m.quantity)
			if err != nil {
				return nil, 0, fmt.Errorf("error rating %q: %w", m.metric, err)
			}
			err = add(ChargeLine{Kind: ChargeLineUsage, EventCount: m.events, ExactAmount: rated.Exact, AmountCents: rated.Amount,
				Usage: &UsageRating{Metric: m.metric, PlanID: plan.id, PlanVersion: plan.version, Rated: rated}})
			if err != nil {
				return nil, 0, err
			}
		}
	}
	for _, l := range []ChargeLine{
		{Kind: ChargeLinePrePriced, EventCount: u.prePriced, AmountCents: u.prePricedCents},
		{Kind: ChargeLineCarried, AmountCents: carried},
	} {
		if l.EventCount == 0 && l.AmountCents == 0 {
			continue
		}
		l.ExactAmount.SetInt64(l.AmountCents)
		if err := add(l); err != nil {
			return nil, 0, err
		}
	}
	return lines, total, nil
}

// tierJSON is one tier of a line as billing.charge_lines.tiers holds it:
// the tier's number in the price (from 1), decimals as strings, exact.
type tierJSON struct {
	Tier       int    `json:"tier"`
	Quantity   string `json:"quantity"`
	UnitAmount string `json:"unit_amount"`
	FlatAmount string `json:"flat_amount"`
	Amount     string `json:"amount"`
}

// chargeLinesInsertTx stores the lines of charge chargeID of customerID. The statement is
// sent with the transaction's next one.
func chargeLinesInsertTx(tx *Tx, chargeID int64, customerID string, lines []ChargeLine, now time.Time) error {
	if len(lines) == 0 {
		return nil
	}
	n := len(lines)
	var (
		nums                            = make([]int32, n)
		kinds                           = make([]string, n)
		metrics, planIDs, models        = make([]*string, n), make([]*string, n), make([]*string, n)
		versions                        = make([]*int32, n)
		quantities, packages, subtotals = make([]*string, n), make([]*string, n), make([]*string, n)
		tiers                           = make([]*string, n)
		events, amounts                 = make([]int64, n), make([]int64, n)
		minimums                        = make([]bool, n)
		exacts                          = make([]string, n)
		grants                          = make([]*string, n)
	)
	for i, l := range lines {
		nums[i], kinds[i], events[i], amounts[i] = l.Line, string(l.Kind), l.EventCount, l.AmountCents
		exacts[i] = pricing.Text(&l.ExactAmount)
		if l.GrantID != "" {
			grants[i] = &l.GrantID
		}
		u := l.Usage
		if u == nil {
			continue
		}
		r := u.Rated
		metric, planID, model := u.Metric, u.PlanID, string(r.Model)
		version := u.PlanVersion
		quantity, subtotal := pricing.Text(&r.Quantity), pricing.Text(&r.Subtotal)
		metrics[i], planIDs[i], models[i], versions[i] = &metric, &planID, &model, &version
		quantities[i], subtotals[i], minimums[i] = &quantity, &subtotal, r.MinimumApplied
		if r.Model == pricing.ModelPackage {
			p := pricing.Text(&r.Packages)
			packages[i] = &p
		}
		if r.Tiers != nil {
			ts := make([]tierJSON, len(r.Tiers))
			for j, t := range r.Tiers {
				ts[j] = tierJSON{Tier: t.Tier + 1, Quantity: pricing.Text(&t.Quantity), UnitAmount: pricing.Text(&t.UnitAmount),
					FlatAmount: pricing.Text(&t.FlatAmount), Amount: pricing.Text(&t.Amount)}
			}
			b, err := json.Marshal(ts)
			if err != nil {
				return fmt.Errorf("error encoding the tiers of %q: %w", metric, err)
			}
			s := string(b)
			tiers[i] = &s
		}
	}
	tx.execLater(nil, `
INSERT INTO billing.charge_lines (charge_id, customer_id, line, kind, metric, plan_id, plan_version, model, quantity,
                                  event_count, tiers, packages, subtotal, minimum_applied, exact_amount, amount_cents,
                                  grant_id, created_at)
SELECT $1, $18, l.line, l.kind, l.metric, l.plan_id, l.plan_version, l.model, l.quantity::numeric, l.event_count,
       l.tiers::jsonb, l.packages::numeric, l.subtotal::numeric, l.minimum_applied, l.exact_amount::numeric,
       l.amount_cents, l.grant_id, $2
FROM unnest($3::integer[], $4::text[], $5::text[], $6::text[], $7::integer[], $8::text[], $9::text[], $10::bigint[],
            $11::text[], $12::text[], $13::text[], $14::boolean[], $15::text[], $16::bigint[], $17::text[])
     AS l (line, kind, metric, plan_id, plan_version, model, quantity, event_count, tiers, packages, subtotal,
           minimum_applied, exact_amount, amount_cents, grant_id)`,
		chargeID, now, nums, kinds, metrics, planIDs, versions, models, quantities, events, tiers, packages, subtotals,
		minimums, exacts, amounts, grants, customerID)
	return nil
}

// ChargeLines returns the lines of charge chargeID, in order; none for a
// charge with nothing to bill (or no such charge).
func (l *Ledger) ChargeLines(ctx context.Context, chargeID int64) ([]ChargeLine, error) {
	rows, err := l.pool.Query(ctx, `
SELECT line, kind, event_count, exact_amount::text, amount_cents, metric, plan_id, plan_version, model,
       quantity::text, tiers, packages::text, subtotal::text, minimum_applied, coalesce(grant_id, '')
FROM billing.charge_lines WHERE charge_id = $1 ORDER BY line`, chargeID)
	if err != nil {
		return nil, fmt.Errorf("error reading the lines of charge %d: %w", chargeID, err)
	}
	lines, err := pgx.CollectRows(rows, scanChargeLine)
	if err != nil {
		return nil, fmt.Errorf("error reading the lines of charge %d: %w", chargeID, err)
	}
	return lines, nil
}

// scanChargeLine scans one row of ChargeLines.
func scanChargeLine(row pgx.CollectableRow) (ChargeLine, error) {
	var l ChargeLine
	var exact string
	var metric, planID, model, quantity, packages, subtotal *string
	var version *int32
	var tiers []byte
	var minimum bool
	err := row.Scan(&l.Line, &l.Kind, &l.EventCount, &exact, &l.AmountCents, &metric, &planID, &version, &model,
		&quantity, &tiers, &packages, &subtotal, &minimum, &l.GrantID)
	if err != nil {
		return l, err
	}
	if err := setDecimal(&l.ExactAmount, &exact); err != nil {
		return l, err
	}
	if l.Kind != ChargeLineUsage {
		return l, nil
	}
	if metric == nil || planID == nil || version == nil || model == nil {
		return l, errors.New("a usage line without its metric or plan")
	}
	u := &UsageRating{Metric: *metric, PlanID: *planID, PlanVersion: *version,
		Rated: pricing.LineItem{Model: pricing.Model(*model), MinimumApplied: minimum, Exact: l.ExactAmount, Amount: l.AmountCents}}
	for _, f := range []struct {
		d *apd.Decimal
		s *string
	}{{&u.Rated.Quantity, quantity}, {&u.Rated.Packages, packages}, {&u.Rated.Subtotal, subtotal}} {
		if err := setDecimal(f.d, f.s); err != nil {
			return l, err
		}
	}
	if tiers != nil {
		var ts []tierJSON
		if err := json.Unmarshal(tiers, &ts); err != nil {
			return l, fmt.Errorf("error reading the tiers of %q: %w", *metric, err)
		}
		u.Rated.Tiers = make([]pricing.TierLine, len(ts))
		for i, t := range ts {
			tl := pricing.TierLine{Tier: t.Tier - 1}
			for _, f := range []struct {
				d *apd.Decimal
				s string
			}{{&tl.Quantity, t.Quantity}, {&tl.UnitAmount, t.UnitAmount}, {&tl.FlatAmount, t.FlatAmount}, {&tl.Amount, t.Amount}} {
				if err := setDecimal(f.d, &f.s); err != nil {
					return l, err
				}
			}
			u.Rated.Tiers[i] = tl
		}
	}
	l.Usage = u
	return l, nil
}

// setDecimal sets d to the decimal s spells; a nil s leaves d zero.
func setDecimal(d *apd.Decimal, s *string) error {
	if s == nil {
		return nil
	}
	if _, _, err := d.SetString(*s); err != nil {
		return fmt.Errorf("error reading decimal %q: %w", *s, err)
	}
	return nil
}
