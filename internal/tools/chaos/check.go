package chaos

import (
	"context"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/stripe/stripe-go/v76"
)

// usdMinimum is Stripe's minimum charge amount in usd, the run's currency
// (written here again, so the check does not take it from Tally's code).
const usdMinimum = 50

// expectation is what the run arranged for a customer on the simulator.
type expectation struct {
	// failureCode "" → every charge must succeed; else each is declined on
	// every try and must end uncollectible with this code, after the
	// dunning schedule's retries.
	failureCode string

	// declines is how many tries of the customer's charges are declined
	// before they pay: that many PaymentIntents end canceled by a retry.
	declines int
}

// periodKey is a customer's period.
type periodKey struct{ customer, period string }

// check verifies the promise from the ledger's tables and the simulator's
// own record of PaymentIntents, independently of Tally's code: acked holds
// each acknowledged event's amount (cents, or a quantity in thousandths),
// plans every plan version the run put, with which checkLines rates every
// charge's lines again. It returns one line per violation, the charges by
// status and the lines it checked, counted as checkLines counts them.
func check(ctx context.Context, conn *pgx.Conn, pis []*stripe.PaymentIntent, acked map[string]int64, expect map[string]expectation,
	plans planBook) ([]string, map[string]int, map[string]int, error) {
	var violations []string
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }

	type key = periodKey
	counts := map[key]int64{} // events counted (not voided) per period
	rows, err := conn.Query(ctx, `SELECT customer_id, period, count(*) FROM billing.usage_events_counted GROUP BY 1, 2`)
	if err != nil {
		return nil, nil, nil, err
	}
	for rows.Next() {
		var k key
		var n int64
		if err := rows.Scan(&k.customer, &k.period, &n); err != nil {
			return nil, nil, nil, err
		}
		counts[k] = n
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}

	// Every event stays in billing.usage_events, voided or not: an
	// acknowledged event must be there, once, as sent.
	stored := map[string]string{}
	rows, err = conn.Query(ctx, `SELECT customer_id || '/' || event_id, amount_cents, quantity::text FROM billing.usage_events`)
	if err != nil {
		return nil, nil, nil, err
	}
	for rows.Next() {
		var k string
		var amount *int64
		var quantity *string
		if err := rows.Scan(&k, &amount, &quantity); err != nil {
			return nil, nil, nil, err
		}
		if _, dup := stored[k]; dup {
			bad("event %s is in the ledger twice", k)
		}
		switch {
		case amount != nil:
			stored[k] = fmt.Sprintf("amount_cents %d", *amount)
		case quantity != nil:
			stored[k] = "quantity " + *quantity
		default:
			stored[k] = "neither amount_cents nor quantity"
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}
	for k, amount := range acked {
		got, ok := stored[k]
		want := fmt.Sprintf("amount_cents %d", amount)
		if strings.HasPrefix(got, "quantity ") {
			// A quantity is stored without trailing zeros: compare exactly.
			sent := big.NewRat(amount, 1000) // quantities are acknowledged in thousandths
			want = "quantity " + ratText(sent)
			if q, err := rat(strings.TrimPrefix(got, "quantity ")); err == nil && q.Cmp(sent) == 0 {
				got = want
			}
		}
		switch {
		case !ok:
			bad("event %s got a 2xx but is not in the ledger", k)
		case got != want:
			bad("event %s acknowledged with %s is stored with %s", k, want, got)
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
		return nil, nil, nil, err
	}
	carriedInto := map[int64]int64{} // charge id → the amounts carried into it
	for rows.Next() {
		var k key
		var c charge
		if err := rows.Scan(&k.customer, &k.period, &c.id, &c.status, &c.amount, &c.events, &c.pi, &c.failureCode, &c.heldReason,
			&c.carriedIn, &c.carriedInto); err != nil {
			return nil, nil, nil, err
		}
		charges[k] = c
		byStatus[c.status]++
		if c.carriedInto != nil {
			carriedInto[*c.carriedInto] += c.amount
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}
	// A total below Stripe's minimum is carried forward, whole, into the
	// customer's next charge: each charge carries in exactly what points to it.
	for k, c := range charges {
		if c.carriedIn != carriedInto[c.id] {
			bad("charge of %s/%s carries in %d; the charges carried into it sum to %d", k.customer, k.period, c.carriedIn, carriedInto[c.id])
		}
	}

	// Each charge's lines, rated again here from the events: want is what
	// each charge must come to.
	lineViolations, want, lines, err := checkLines(ctx, conn, plans)
	if err != nil {
		return nil, nil, nil, err
	}
	violations = append(violations, lineViolations...)

	pisOf := map[key][]*stripe.PaymentIntent{}
	for _, pi := range pis {
		k := key{pi.Metadata["customer_id"], pi.Metadata["period"]}
		pisOf[k] = append(pisOf[k], pi)
		if _, ok := counts[k]; !ok {
			bad("PaymentIntent %s is for %s/%s, which has no events", pi.ID, k.customer, k.period)
			continue
		}
		w, ok := want[k]
		if !ok {
			bad("PaymentIntent %s is for %s/%s, which has no charge", pi.ID, k.customer, k.period)
			continue
		}
		if pi.Amount != w {
			bad("PaymentIntent %s of %s/%s is for %d, the events rated again come to %d (%d carried in)", pi.ID, k.customer, k.period,
				pi.Amount, w, charges[k].carriedIn)
		}
	}

	canceledOf := map[string]int{} // customer → PaymentIntents canceled
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].customer+keys[i].period < keys[j].customer+keys[j].period })
	for _, k := range keys {
		c, ok := charges[k]
		if !ok {
			bad("%s/%s has %d events and no charge", k.customer, k.period, counts[k])
			continue
		}
		if c.amount != want[k] || c.events != counts[k] {
			bad("charge of %s/%s is %d (%d carried in) for %d events; its events rated again come to %d for %d", k.customer, k.period,
				c.amount, c.carriedIn, c.events, want[k], counts[k])
		}
		mine := pisOf[k]
		// At most one succeeded PaymentIntent per charge; every one but the
		// charge's own was canceled by a dunning retry before the next.
		succeeded := 0
		var ownStatus stripe.PaymentIntentStatus
		for _, pi := range mine {
			if pi.ID == c.pi {
				ownStatus = pi.Status
			}
			if pi.Status == stripe.PaymentIntentStatusSucceeded {
				succeeded++
			}
			if pi.ID != c.pi && pi.Status != stripe.PaymentIntentStatusCanceled {
				bad("PaymentIntent %s of %s/%s is %s: not the charge's (%s) and not canceled", pi.ID, k.customer, k.period, pi.Status, c.pi)
			}
			if pi.Status == stripe.PaymentIntentStatusCanceled {
				canceledOf[k.customer]++
			}
		}
		if succeeded > 1 {
			bad("%s/%s has %d succeeded PaymentIntents", k.customer, k.period, succeeded)
		}
		switch want := expect[k.customer].failureCode; {
		case c.status == "covered":
			if c.amount != 0 || len(mine) != 0 {
				bad("charge of %s/%s is covered by credits for %d with %d PaymentIntents, want 0 and none",
					k.customer, k.period, c.amount, len(mine))
			}
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
		case want == "" && (succeeded != 1 || ownStatus != stripe.PaymentIntentStatusSucceeded):
			bad("charge of %s/%s (%s) does not match the simulator's PaymentIntents (%d succeeded, its own %q)",
				k.customer, k.period, c.pi, succeeded, ownStatus)
		case want != "" && (c.status != "uncollectible" || c.failureCode != want):
			bad("charge of %s/%s is %s (%s), want uncollectible with %s", k.customer, k.period, c.status, c.failureCode, want)
		case want != "" && (len(mine) != 1+dunningRetries || succeeded != 0):
			bad("charge of %s/%s is uncollectible with %d PaymentIntents (%d succeeded), want %d tries and none succeeded",
				k.customer, k.period, len(mine), succeeded, 1+dunningRetries)
		}
	}
	pisOfCustomer := map[string]int{}
	for _, pi := range pis {
		pisOfCustomer[pi.Metadata["customer_id"]]++
	}
	for customer, e := range expect {
		// A customer whose every charge was carried forward (below Stripe's
		// minimum) made no call for the decline to answer.
		if e.declines > 0 && pisOfCustomer[customer] > 0 && canceledOf[customer] != e.declines {
			bad("customer %s was declined %d times before paying: of its %d PaymentIntents, %d were canceled by retries, want as many as declines",
				customer, e.declines, pisOfCustomer[customer], canceledOf[customer])
		}
	}
	for k, c := range charges {
		if c.status == "pending" || c.status == "unknown" || c.status == "processing" || c.status == "past_due" {
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
		return nil, nil, nil, err
	}
	for rows.Next() {
		var period, currency string
		var reserved, charged int64
		if err := rows.Scan(&period, &currency, &reserved, &charged); err != nil {
			return nil, nil, nil, err
		}
		if reserved != charged {
			bad("spend of %s %s is %d; its succeeded charges sum to %d", period, currency, reserved, charged)
		}
		if reserved > periodBudget {
			bad("spend of %s %s is %d, over the budget of %d", period, currency, reserved, int64(periodBudget))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, nil, err
	}
	return violations, byStatus, lines, nil
}

// checkNotifications verifies the producer's side: every notification Tally
// wrote reached the receiver (through its random failures) with a valid
// signature, nothing else did, and the notifications agree with the charges:
// one per final status (succeeded, uncollectible, failed, carried_forward)
// and one charge.past_due per retry (each retry canceled one PaymentIntent).
func checkNotifications(ctx context.Context, conn *pgx.Conn, rcv *receiver) ([]string, error) {
	var violations []string
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	got, refused, _, _ := rcv.snapshot()
	for _, why := range refused {
		bad("webhook receiver refused a delivery: %s", why)
	}
	written := map[string]bool{}
	rows, err := conn.Query(ctx, `SELECT id FROM billing.notifications`)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		written[id] = true
		if _, ok := got[id]; !ok {
			bad("notification %s was written but never delivered", id)
		}
	}
	for id, n := range got {
		if !written[id] {
			bad("the receiver took notification %s (%s), which Tally never wrote", id, n.Type)
		}
	}
	var undelivered int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM billing.webhook_deliveries WHERE status <> 'delivered'`).Scan(&undelivered); err != nil {
		return nil, err
	}
	if undelivered > 0 {
		bad("%d webhook deliveries are not delivered", undelivered)
	}

	type chargeKey struct {
		id  string
		typ string
	}
	count := map[chargeKey]int{}
	for _, n := range got {
		if strings.HasPrefix(n.Type, "charge.") {
			count[chargeKey{n.Data.Object.ID.String(), n.Type}]++
		}
	}
	rows, err = conn.Query(ctx, `
SELECT id::text, status, cardinality(retired_payment_intent_ids) FROM billing.charges`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id, status string
		var retries int
		if err := rows.Scan(&id, &status, &retries); err != nil {
			return nil, err
		}
		switch status {
		case "succeeded", "uncollectible", "failed", "carried_forward":
			if n := count[chargeKey{id, "charge." + status}]; n != 1 {
				bad("charge %d is %s: %d charge.%s notifications, want 1", atoi(id), status, n, status)
			}
		}
		if n := count[chargeKey{id, "charge.past_due"}]; n != retries {
			bad("charge %d was retried %d times: %d charge.past_due notifications, want as many", atoi(id), retries, n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(got) == 0 {
		bad("the webhook receiver took no notification")
	}
	return violations, nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// checkVoids holds the ledger's voids to what the producers asked for:
// every void acknowledged with a 2xx is in billing.usage_event_voids, and
// every void there was acknowledged or its answer lost (never one asked
// for by no one, nor one refused). The charges' lines (checkLines) count
// the events not voided, so a void that landed is netted out of its
// period's charge.
func checkVoids(ctx context.Context, conn *pgx.Conn, voided, lost map[string]bool) ([]string, int, error) {
	var violations []string
	rows, err := conn.Query(ctx, `SELECT customer_id || '/' || event_id FROM billing.usage_event_voids`)
	if err != nil {
		return nil, 0, err
	}
	inLedger, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, 0, err
	}
	found := map[string]bool{}
	for _, k := range inLedger {
		found[k] = true
		if !voided[k] && !lost[k] {
			violations = append(violations, fmt.Sprintf("event %s is voided in the ledger, but its void was refused or never asked for", k))
		}
	}
	for k := range voided {
		if !found[k] {
			violations = append(violations, fmt.Sprintf("the void of event %s got a 2xx but is not in the ledger", k))
		}
	}
	return violations, len(inLedger), nil
}
