package chaos

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/stripe/stripe-go/v76"
)

// expectation is what the run arranged for a customer on the simulator.
type expectation struct {
	failureCode string // "" → must succeed; else the charge must fail with this code
}

// check verifies the promise from the ledger's tables and the simulator's
// own record of PaymentIntents, independently of Tally's code. It returns one
// line per violation.
func check(ctx context.Context, conn *pgx.Conn, pis []*stripe.PaymentIntent, acked map[string]int64, expect map[string]expectation) ([]string, map[string]int, error) {
	var violations []string
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }

	type key struct{ customer, period string }
	type sum struct {
		count, total int64
	}
	sums := map[key]sum{}
	rows, err := conn.Query(ctx, `SELECT customer_id, period, count(*), sum(amount_cents)::bigint FROM billing.usage_events GROUP BY 1, 2`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var k key
		var s sum
		if err := rows.Scan(&k.customer, &k.period, &s.count, &s.total); err != nil {
			return nil, nil, err
		}
		sums[k] = s
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}

	stored := map[string]int64{}
	rows, err = conn.Query(ctx, `SELECT customer_id || '/' || event_id, amount_cents FROM billing.usage_events`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var k string
		var a int64
		if err := rows.Scan(&k, &a); err != nil {
			return nil, nil, err
		}
		if _, dup := stored[k]; dup {
			bad("event %s is in the ledger twice", k)
		}
		stored[k] = a
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	for k, amount := range acked {
		got, ok := stored[k]
		switch {
		case !ok:
			bad("event %s got a 2xx but is not in the ledger", k)
		case got != amount:
			bad("event %s acknowledged with amount %d is stored with %d", k, amount, got)
		}
	}

	type charge struct {
		status, pi, failureCode, heldReason string
		amount, events                      int64
	}
	charges := map[key]charge{}
	byStatus := map[string]int{}
	rows, err = conn.Query(ctx, `
SELECT customer_id, period, status, amount_cents, event_count, coalesce(stripe_payment_intent_id, ''),
       coalesce(failure_code, ''), coalesce(held_reason, '')
FROM billing.charges`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var k key
		var c charge
		if err := rows.Scan(&k.customer, &k.period, &c.status, &c.amount, &c.events, &c.pi, &c.failureCode, &c.heldReason); err != nil {
			return nil, nil, err
		}
		charges[k] = c
		byStatus[c.status]++
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}

	pisOf := map[key][]*stripe.PaymentIntent{}
	for _, pi := range pis {
		k := key{pi.Metadata["customer_id"], pi.Metadata["period"]}
		pisOf[k] = append(pisOf[k], pi)
		s, ok := sums[k]
		if !ok {
			bad("PaymentIntent %s is for %s/%s, which has no events", pi.ID, k.customer, k.period)
			continue
		}
		if pi.Amount != s.total {
			bad("PaymentIntent %s of %s/%s is for %d, the ledger sums to %d", pi.ID, k.customer, k.period, pi.Amount, s.total)
		}
	}

	keys := make([]key, 0, len(sums))
	for k := range sums {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].customer+keys[i].period < keys[j].customer+keys[j].period })
	for _, k := range keys {
		s := sums[k]
		c, ok := charges[k]
		if !ok {
			bad("%s/%s has %d events totalling %d and no charge", k.customer, k.period, s.count, s.total)
			continue
		}
		if c.amount != s.total || c.events != s.count {
			bad("charge of %s/%s is %d for %d events; the ledger has %d for %d", k.customer, k.period, c.amount, c.events, s.total, s.count)
		}
		mine := pisOf[k]
		if len(mine) > 1 {
			ids := make([]string, len(mine))
			for i, pi := range mine {
				ids[i] = pi.ID
			}
			bad("%s/%s has %d PaymentIntents: %v", k.customer, k.period, len(mine), ids)
		}
		switch want := expect[k.customer].failureCode; {
		case c.status == "held":
			if c.heldReason == "" {
				bad("charge of %s/%s is held without a reason", k.customer, k.period)
			}
		case want == "" && c.status != "succeeded":
			bad("charge of %s/%s is %s (%s), want succeeded", k.customer, k.period, c.status, c.failureCode)
		case want == "" && (len(mine) != 1 || mine[0].ID != c.pi || mine[0].Status != stripe.PaymentIntentStatusSucceeded):
			bad("charge of %s/%s (%s) does not match the simulator's PaymentIntents", k.customer, k.period, c.pi)
		case want != "" && (c.status != "failed" || c.failureCode != want):
			bad("charge of %s/%s is %s (%s), want failed with %s", k.customer, k.period, c.status, c.failureCode, want)
		}
	}
	for k, c := range charges {
		if c.status == "pending" || c.status == "unknown" || c.status == "processing" {
			bad("charge of %s/%s is still %s", k.customer, k.period, c.status)
		}
	}

	// The period budget's spend is what the settled charges that moved money
	// (or may have: held after a call) reserve, never above the budget.
	rows, err = conn.Query(ctx, `
SELECT s.period, s.currency, s.reserved_cents,
       coalesce((SELECT sum(amount_cents) FROM billing.charges c
                 WHERE c.period = s.period AND c.currency = s.currency
                   AND (c.status = 'succeeded' OR (c.status = 'held' AND c.budget_reserved))), 0)::bigint
FROM billing.period_spend s`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var period, currency string
		var reserved, charged int64
		if err := rows.Scan(&period, &currency, &reserved, &charged); err != nil {
			return nil, nil, err
		}
		if reserved != charged {
			bad("spend of %s %s is %d; its succeeded charges sum to %d", period, currency, reserved, charged)
		}
		if reserved > periodBudget {
			bad("spend of %s %s is %d, over the budget of %d", period, currency, reserved, int64(periodBudget))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	return violations, byStatus, nil
}
