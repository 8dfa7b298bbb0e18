package chaos

import (
	"context"
	"fmt"
	"math/big"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// periodEvents is what a period's counted (not voided) events come to,
// summed here from the events one by one.
type periodEvents struct {
	prePriced      int64 // events with amount_cents
	prePricedCents int64
	metrics        map[string]*metricEvents // quantity events, by metric
}

type metricEvents struct {
	events   int64
	quantity *big.Rat
}

// ledgerLine is a row of billing.charge_lines.
type ledgerLine struct {
	line                  int32
	kind                  string
	metric, planID        string
	planVersion           int32
	quantity, exactAmount string
	events, amount        int64
	grantID               string // a credit line's
}

// periodPlanVersion is the plan version billing.periods recorded for a period.
type periodPlanVersion struct {
	id      string
	version int32
}

// checkLines rates every charge again, from billing.usage_events_counted
// with rateQuantity and the plan versions the run put (plans), and holds
// billing.charge_lines to it: one usage line per metric of the period's
// quantity events, naming the plan version billing.periods recorded for
// the period, with the net quantity, the exact amount and the amount
// rounded half-up, to the cent; a pre_priced line with the pre-priced
// events' count and sum; a carried line with what the charge carried in;
// no other line; and the charge's amount the sum of its lines. It returns
// the violations, what each charge must come to (the sum of the lines
// rated here) and the lines it checked, counted by what they cover
// (lineCounts).
func checkLines(ctx context.Context, conn *pgx.Conn, plans planBook) ([]string, map[periodKey]int64, map[string]int, error) {
	var violations []string
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }

	periodPlans := map[periodKey]periodPlanVersion{}
	rows, err := conn.Query(ctx, `SELECT customer_id, period, plan_id, plan_version FROM billing.periods WHERE plan_id IS NOT NULL`)
	if err != nil {
		return nil, nil, nil, err
	}
	for rows.Next() {
		var k periodKey
		var p periodPlanVersion
		if err := rows.Scan(&k.customer, &k.period, &p.id, &p.version); err != nil {
			return nil, nil, nil, err
		}
		periodPlans[k] = p
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}

	events := map[periodKey]*periodEvents{}
	rows, err = conn.Query(ctx, `SELECT customer_id, period, amount_cents, metric, quantity::text FROM billing.usage_events_counted`)
	if err != nil {
		return nil, nil, nil, err
	}
	for rows.Next() {
		var k periodKey
		var amount *int64
		var metric, quantity *string
		if err := rows.Scan(&k.customer, &k.period, &amount, &metric, &quantity); err != nil {
			return nil, nil, nil, err
		}
		e := events[k]
		if e == nil {
			e = &periodEvents{metrics: map[string]*metricEvents{}}
			events[k] = e
		}
		if amount != nil {
			e.prePriced++
			e.prePricedCents += *amount
			continue
		}
		if metric == nil || quantity == nil {
			bad("an event of %s/%s has neither an amount nor a metric and quantity", k.customer, k.period)
			continue
		}
		q, err := rat(*quantity)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("error reading a quantity of %s/%s: %w", k.customer, k.period, err)
		}
		m := e.metrics[*metric]
		if m == nil {
			m = &metricEvents{quantity: new(big.Rat)}
			e.metrics[*metric] = m
		}
		m.events++
		m.quantity.Add(m.quantity, q)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}

	linesOf := map[int64][]ledgerLine{}
	rows, err = conn.Query(ctx, `
SELECT charge_id, line, kind, coalesce(metric, ''), coalesce(plan_id, ''), coalesce(plan_version, 0),
       coalesce(quantity::text, ''), event_count, exact_amount::text, amount_cents, coalesce(grant_id, '')
FROM billing.charge_lines ORDER BY charge_id, line`)
	if err != nil {
		return nil, nil, nil, err
	}
	checked := map[string]int{}
	for rows.Next() {
		var id int64
		var l ledgerLine
		if err := rows.Scan(&id, &l.line, &l.kind, &l.metric, &l.planID, &l.planVersion, &l.quantity, &l.events,
			&l.exactAmount, &l.amount, &l.grantID); err != nil {
			return nil, nil, nil, err
		}
		linesOf[id] = append(linesOf[id], l)
		if l.kind != "usage" {
			checked[l.kind]++
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}

	type charge struct {
		key                   periodKey
		id, amount, carriedIn int64
	}
	var charges []charge
	rows, err = conn.Query(ctx, `SELECT customer_id, period, id, amount_cents, carried_in_cents FROM billing.charges ORDER BY id`)
	if err != nil {
		return nil, nil, nil, err
	}
	for rows.Next() {
		var c charge
		if err := rows.Scan(&c.key.customer, &c.key.period, &c.id, &c.amount, &c.carriedIn); err != nil {
			return nil, nil, nil, err
		}
		charges = append(charges, c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}

	want := map[periodKey]int64{}
	for _, c := range charges {
		of := fmt.Sprintf("charge of %s/%s", c.key.customer, c.key.period)
		e := events[c.key]
		if e == nil {
			e = &periodEvents{metrics: map[string]*metricEvents{}}
		}
		got := map[string]ledgerLine{} // "usage <metric>", "pre_priced", "carried"
		var linesSum int64
		for _, l := range linesOf[c.id] {
			name := l.kind
			switch l.kind {
			case "usage":
				name += " " + l.metric
			case "credit":
				name += " " + l.grantID
			}
			if _, dup := got[name]; dup {
				bad("%s has two %s lines", of, name)
			}
			got[name] = l
			linesSum += l.amount
		}
		if linesSum != c.amount {
			bad("%s is %d; its lines sum to %d", of, c.amount, linesSum)
		}

		var total int64
		plan, hasPlan := periodPlans[c.key]
		for _, metric := range sortedKeys(e.metrics) {
			m := e.metrics[metric]
			name := "usage " + metric
			l, ok := got[name]
			delete(got, name)
			if !hasPlan {
				bad("%s: the period has %d quantity events of %s but no plan", of, m.events, metric)
				continue
			}
			price, ok2 := plans[plan.id][plan.version].Prices[metric]
			if !ok2 {
				bad("%s: the period's plan %s version %d is not one the run put with a price for %s", of, plan.id, plan.version, metric)
				continue
			}
			exact, cents, err := rateQuantity(price, m.quantity)
			if err != nil {
				bad("%s: error rating %s %s: %v", of, metric, m.quantity.FloatString(12), err)
				continue
			}
			total += cents
			countUsage(checked, plan, price, m.quantity)
			if !ok {
				bad("%s has no line for %s %s (%d events), which rate to %d", of, ratText(m.quantity), metric, m.events, cents)
				continue
			}
			if l.planID != plan.id || l.planVersion != plan.version {
				bad("%s: the %s line is rated with plan %s version %d; the period opened with version %d of %s", of, metric,
					l.planID, l.planVersion, plan.version, plan.id)
			}
			if q, err := rat(l.quantity); err != nil || q.Cmp(m.quantity) != 0 || l.events != m.events {
				bad("%s: the %s line is for %s in %d events; the events sum to %s in %d", of, metric, l.quantity, l.events,
					ratText(m.quantity), m.events)
			}
			if x, err := rat(l.exactAmount); err != nil || x.Cmp(exact) != 0 || l.amount != cents {
				bad("%s: the %s line of %s comes to %s, %d cents; rated again (plan %s version %d) it is %s, %d cents", of, metric,
					l.quantity, l.exactAmount, l.amount, plan.id, plan.version, ratText(exact), cents)
			}
		}
		for _, fixed := range []struct {
			kind          string
			events, cents int64
		}{{"pre_priced", e.prePriced, e.prePricedCents}, {"carried", 0, c.carriedIn}} {
			l, ok := got[fixed.kind]
			delete(got, fixed.kind)
			total += fixed.cents
			switch {
			case !ok && (fixed.events > 0 || fixed.cents > 0):
				bad("%s has no %s line; want %d cents for %d events", of, fixed.kind, fixed.cents, fixed.events)
			case ok && (l.amount != fixed.cents || l.events != fixed.events):
				bad("%s: its %s line is %d cents for %d events; want %d for %d", of, fixed.kind, l.amount, l.events, fixed.cents, fixed.events)
			}
		}
		// Credits (one line per grant applied, checked against the grants
		// by checkCredits) take from what the lines above come to.
		var credits int64
		for _, name := range sortedKeys(got) {
			if l := got[name]; l.kind == "credit" {
				delete(got, name)
				credits -= l.amount
				if l.amount >= 0 || l.events != 0 || l.grantID == "" {
					bad("%s: its credit line %q is %d cents for %d events", of, l.grantID, l.amount, l.events)
				}
			}
		}
		if credits > total {
			bad("%s: its credits (%d) are more than its lines come to (%d)", of, credits, total)
		}
		extra := sortedKeys(got)
		if len(extra) > 0 {
			bad("%s has lines the events do not explain: %s", of, strings.Join(extra, ", "))
		}
		want[c.key] = total - credits
	}
	sort.Strings(violations)
	return violations, want, checked, nil
}

// countUsage counts a usage line rated here: by plan version, and whether
// its quantity is zero or exactly on a tier bound or a whole number of
// packages, which the workload aims at.
func countUsage(counts map[string]int, plan periodPlanVersion, p priceDef, q *big.Rat) {
	counts[fmt.Sprintf("usage %s v%d", plan.id, plan.version)]++
	if q.Sign() == 0 {
		counts["usage of zero"]++
		return
	}
	onBound := false
	for _, t := range p.Tiers {
		if t.UpTo != nil {
			b, err := rat(*t.UpTo)
			onBound = onBound || (err == nil && b.Cmp(q) == 0)
		}
	}
	if size, err := rat(p.PackageSize); p.Model == "package" && err == nil {
		onBound = new(big.Rat).Quo(q, size).IsInt()
	}
	if onBound {
		counts["usage on a bound"]++
	}
}

// ratText writes r as a decimal with as many digits as it needs (up to 12
// after the point, a quantity's limit).
func ratText(r *big.Rat) string {
	s := r.FloatString(12)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
