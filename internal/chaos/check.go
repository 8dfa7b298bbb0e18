package chaos

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/stripe/stripe-go/v76"
)

// usdMinimum is Stripe's minimum charge amount in usd, the run's currency
// (written here again, so the check does not take it from Tally's code).
const usdMinimum = 50

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
		id, amount, events, carriedIn       int64
		carriedInto                         *int64
	}
	charges := map[key]charge{}
	byStatus := map[string]int{}
	rows, err = conn.Query(ctx, `
SELECT customer_id, period, id, status, amount_cents, event_count, coalesce(stripe_payment_intent_id, ''),
       coalesce(failure_code, ''), coalesce(held_reason, ''), carried_in_cents, carried_into
FROM billing.charges`)
	if err != nil {
		return nil, nil, err
	}
	carriedInto := map[int64]int64{} // charge id → the amounts carried into it
	for rows.Next() {
		var k key
		var c charge
		if err := rows.Scan(&k.customer, &k.period, &c.id, &c.status, &c.amount, &c.events, &c.pi, &c.failureCode, &c.heldReason,
			&c.carriedIn, &c.carriedInto); err != nil {
			return nil, nil, err
		}
		charges[k] = c
		byStatus[c.status]++
		if c.carriedInto != nil {
			carriedInto[*c.carriedInto] += c.amount
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	// A total below Stripe's minimum is carried forward, whole, into the
	// customer's next charge: each charge carries in exactly what points to it.
	for k, c := range charges {
		if c.carriedIn != carriedInto[c.id] {
			bad("charge of %s/%s carries in %d; the charges carried into it sum to %d", k.customer, k.period, c.carriedIn, carriedInto[c.id])
		}
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
		if want := s.total + charges[k].carriedIn; pi.Amount != want {
			bad("PaymentIntent %s of %s/%s is for %d, the ledger sums to %d (%d carried in)", pi.ID, k.customer, k.period, pi.Amount, want, charges[k].carriedIn)
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
		if c.amount-c.carriedIn != s.total || c.events != s.count {
			bad("charge of %s/%s is %d (%d carried in) for %d events; the ledger has %d for %d", k.customer, k.period,
				c.amount, c.carriedIn, c.events, s.total, s.count)
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
		case c.amount < usdMinimum:
			if c.status != "carried_forward" || len(mine) != 0 {
				bad("charge of %s/%s is %d, below Stripe's minimum: it is %s with %d PaymentIntents, want carried_forward with none",
					k.customer, k.period, c.amount, c.status, len(mine))
			}
		case c.status == "carried_forward":
			bad("charge of %s/%s is %d and carried_forward, not below Stripe's minimum", k.customer, k.period, c.amount)
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
