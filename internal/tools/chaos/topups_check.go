package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stripe/stripe-go/v76"
)

// topUpKeyOf is a PaymentIntent's top-up key (metadata.tally_top_up_key),
// "" for a charge's.
func topUpKeyOf(pi *stripe.PaymentIntent) string { return pi.Metadata["tally_top_up_key"] }

// splitPaymentIntents separates the top-ups' PaymentIntents (those carrying
// a top-up key) from the others, which check holds to the charges.
func splitPaymentIntents(pis []*stripe.PaymentIntent) (charges, topUps []*stripe.PaymentIntent) {
	for _, pi := range pis {
		if topUpKeyOf(pi) != "" {
			topUps = append(topUps, pi)
		} else {
			charges = append(charges, pi)
		}
	}
	return charges, topUps
}

// ledgerTopUp is a row of billing.top_ups as the check reads it.
type ledgerTopUp struct {
	id                                     int64
	customer, topUpID, source, status      string
	amount                                 int64
	currency, key, pi, heldReason, stripeC string
	createdAt                              time.Time
	createdBy                              string
	toSucceeded, toFailed                  int // transitions into each
}

func (t *ledgerTopUp) name() string { return "top-up " + t.customer + "/" + t.topUpID }

// topUpGrant is a grant a top-up bought (credit_grants.top_up_id), or one
// named like one.
type topUpGrant struct {
	customer, grantID, currency string
	amount                      int64
	topUp                       *int64
}

// rechargeCustomer is a customer's automatic recharge at the end of the
// run, and what its balance is made of.
type rechargeCustomer struct {
	below, to *int64
	armed     bool
	count     int
	initial   int64      // its grants not bought by top-ups, in its currency
	expiring  int        // its grants with an expiry
	ended     int        // its expired and voided entries
	balance   int64      // what is left of its grants not expired, from their entries
	lastClose *time.Time // its last charge's creation
}

// checkTopUps holds every top-up to Stripe's record and the ledger's grants
// (see the list in the body), reads the run's own record of what it asked
// for (book) and the notifications the receiver took, and counts what it
// checked. pis is every PaymentIntent on the simulator.
func checkTopUps(ctx context.Context, conn *pgx.Conn, pis []*stripe.PaymentIntent, book *topUpBook,
	got map[string]notification) ([]string, map[string]int, error) {
	var violations []string
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	counts := map[string]int{}

	topUps, err := readTopUps(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	byKey := map[string]*ledgerTopUp{}
	byName := map[string]*ledgerTopUp{} // customer/top_up_id
	for _, t := range topUps {
		byKey[t.key], byName[t.customer+"/"+t.topUpID] = t, t
	}

	// 1. Every PaymentIntent carrying a top-up key is its top-up's own, for
	// its terms; at most one per key succeeded.
	_, topUpPIs := splitPaymentIntents(pis)
	pisOf := map[string][]*stripe.PaymentIntent{}
	for _, pi := range topUpPIs {
		counts["payment intents"]++
		key := topUpKeyOf(pi)
		t, ok := byKey[key]
		if !ok {
			bad("PaymentIntent %s (%s, %d) carries top-up key %s, which no top-up in the ledger has", pi.ID, pi.Status, pi.Amount, key)
			continue
		}
		pisOf[key] = append(pisOf[key], pi)
		var stripeCustomer string
		if pi.Customer != nil {
			stripeCustomer = pi.Customer.ID
		}
		if pi.Amount != t.amount || string(pi.Currency) != t.currency || stripeCustomer != t.stripeC ||
			pi.Metadata["customer_id"] != t.customer || pi.Metadata["top_up_id"] != t.topUpID {
			bad("PaymentIntent %s carries the key of %s (%d %s, %s) but is for %d %s, %s, metadata %s/%s", pi.ID, t.name(),
				t.amount, t.currency, t.stripeC, pi.Amount, pi.Currency, stripeCustomer, pi.Metadata["customer_id"], pi.Metadata["top_up_id"])
		}
		if pi.ID != t.pi {
			bad("PaymentIntent %s (%s) carries the key of %s, whose own is %q: a second PaymentIntent for one top-up", pi.ID, pi.Status,
				t.name(), t.pi)
		}
	}

	grants, err := readTopUpGrants(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	grantsOf := map[int64][]topUpGrant{}
	for _, g := range grants {
		if g.topUp == nil {
			bad("grant %s of %s is named like a top-up's but no top-up bought it", g.grantID, g.customer)
			continue
		}
		grantsOf[*g.topUp] = append(grantsOf[*g.topUp], g)
	}

	// 2. Each top-up: settled; succeeded ⇔ exactly one succeeded
	// PaymentIntent carrying its key, its own, and exactly one grant of its
	// amount; otherwise none of either. Nothing in this run may hold or
	// cancel a top-up (no customer has a cap, the run cancels none).
	for _, t := range topUps {
		counts["top-ups"]++
		var succeededIDs []string
		for _, pi := range pisOf[t.key] {
			if pi.Status == stripe.PaymentIntentStatusSucceeded {
				succeededIDs = append(succeededIDs, pi.ID)
			}
		}
		succeeded, succeededID := len(succeededIDs), strings.Join(succeededIDs, ", ")
		mine := grantsOf[t.id]
		switch t.status {
		case "succeeded":
			counts["succeeded"]++
			if succeeded != 1 || succeededID != t.pi {
				bad("%s is succeeded with PaymentIntent %s; Stripe has %d succeeded PaymentIntents carrying its key (%s)", t.name(), t.pi,
					succeeded, succeededID)
			}
			if len(mine) != 1 {
				bad("%s is succeeded and bought %d grants, want 1", t.name(), len(mine))
			}
			for _, g := range mine {
				if g.customer != t.customer || g.grantID != "top_up:"+t.topUpID || g.amount != t.amount || g.currency != t.currency {
					bad("%s (%d %s) bought grant %s of %s for %d %s", t.name(), t.amount, t.currency, g.grantID, g.customer, g.amount, g.currency)
				}
			}
		default:
			counts[t.status]++
			if succeeded > 0 {
				bad("%s is %s, but Stripe has %d succeeded PaymentIntents carrying its key (%s): money moved without credits",
					t.name(), t.status, succeeded, succeededID)
			}
			if len(mine) > 0 {
				bad("%s is %s but bought %d grants", t.name(), t.status, len(mine))
			}
			switch t.status {
			case "pending", "unknown", "processing":
				bad("%s is still %s after the drain", t.name(), t.status)
			case "held":
				bad("%s is held (%s): nothing in this run should hold a top-up", t.name(), t.heldReason)
			case "canceled":
				bad("%s is canceled, though the run canceled none", t.name())
			}
		}
		if succeeded > 1 {
			bad("%s has %d succeeded PaymentIntents: bought more than once", t.name(), succeeded)
		}
		if t.source == "recharge" {
			counts["recharges"]++
		} else {
			counts["bought"]++
		}

		// Its notifications: one top_up.succeeded and top_up.failed per move
		// into each, and one credit.balance_low per recharge.
		want := map[string]int{"top_up.succeeded": t.toSucceeded, "top_up.failed": t.toFailed, "credit.balance_low": 0}
		if t.source == "recharge" {
			want["credit.balance_low"] = 1
		}
		for typ, n := range want {
			if have := notified(got, typ, t.customer, t.topUpID); have != n {
				bad("%s: %d %s notifications, want %d", t.name(), have, typ, n)
			}
		}
	}

	// 3. What the run asked for: every top-up answered 2xx is in the ledger
	// with the amount posted; every top-up in the ledger from the API was
	// posted, with that amount (a refused conflicting re-post changed
	// nothing); no two answers created the same top-up; and the answers a
	// client must never get.
	book.mu.Lock()
	for k, p := range book.planned {
		t, ok := byName[k]
		switch {
		case !ok && book.acked[k]:
			bad("top-up %s was answered 2xx but is not in the ledger", k)
		case ok && (t.amount != p.amount || t.source != "api"):
			bad("%s was posted for %d; the ledger has %d (%s)", t.name(), p.amount, t.amount, t.source)
		}
		if n := book.created[k]; n > 1 {
			bad("top-up %s was answered 201 Created %d times", k, n)
		}
	}
	for _, t := range topUps {
		if _, ok := book.planned[t.customer+"/"+t.topUpID]; t.source == "api" && !ok {
			bad("%s (api) is in the ledger, but the run never posted it", t.name())
		}
	}
	counts["posted"], counts["acknowledged"] = len(book.planned), len(book.acked)
	violations = append(violations, book.odd...)
	book.mu.Unlock()

	// 4. Stripe's succeeded total per Stripe customer is the ledger's
	// succeeded charges plus its succeeded top-ups.
	totals, err := ledgerTotals(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	onStripe := map[string]int64{}
	for _, pi := range pis {
		if pi.Status != stripe.PaymentIntentStatusSucceeded {
			continue
		}
		c := ""
		if pi.Customer != nil {
			c = pi.Customer.ID
		}
		onStripe[c] += pi.Amount
	}
	for _, c := range sortedKeys(mergeKeys(onStripe, totals)) {
		l := totals[c]
		if onStripe[c] != l[0]+l[1] {
			bad("Stripe customer %s: succeeded PaymentIntents total %d; the ledger's succeeded charges (%d) and top-ups (%d) total %d",
				c, onStripe[c], l[0], l[1], l[0]+l[1])
		}
	}

	// 5. Automatic recharges.
	rv, err := checkRecharges(ctx, conn, topUps)
	if err != nil {
		return nil, nil, err
	}
	violations = append(violations, rv...)
	return violations, counts, nil
}

// checkRecharges holds each customer's automatic recharges to "one top-up
// per crossing of the threshold, for what brings the balance back to the
// target", on what the ledger recorded:
//   - its recharge top-ups are recharge-1 … recharge-N, N its recharge_count
//     (one top-up each time a close disarmed it);
//   - each was started by a close (it was created at the instant a charge of
//     its customer was, in that close's transaction) or by a usage roll-up
//     (created_by usage_rollup), whose balance is projected: less the rated
//     usage of the open period, which the check cannot replay. A roll-up's
//     recharge is held only to being for at least what the balance the
//     closes left lacked (the usage it projected is never negative);
//   - each is for exactly what the balance its close saw lacked: the check
//     replays the balance from the grants the customer started with, the
//     credits each close applied (by the charges' creation) and the grants
//     of the recharges before it. In this run a recharge customer gets no
//     other grant after the start, none of its grants expires and nothing
//     is voided (checked), so after a recharge's grant the balance is the
//     target again, and only a close that applies credits can bring it
//     below: a recharge started by a close that saw the balance at or above
//     the threshold, or that did not see the previous recharge's grant (two
//     top-ups for one crossing), or after a recharge that did not succeed
//     (nothing could have armed it again), is a violation;
//   - none is left armed below its threshold after a close: the close
//     would have started one.
func checkRecharges(ctx context.Context, conn *pgx.Conn, topUps []*ledgerTopUp) ([]string, error) {
	var violations []string
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	customers, err := readRechargeCustomers(ctx, conn)
	if err != nil {
		return nil, err
	}
	type closed struct {
		at      time.Time
		applied int64 // credits the close applied
	}
	closes := map[string][]closed{}
	rows, err := conn.Query(ctx, `
SELECT c.customer_id, c.created_at,
       coalesce(-(SELECT sum(e.amount_cents) FROM billing.credit_grant_entries e WHERE e.charge_id = c.id AND e.kind = 'applied'), 0)::bigint
FROM billing.charges c ORDER BY c.created_at`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var customer string
		var c closed
		if err := rows.Scan(&customer, &c.at, &c.applied); err != nil {
			return nil, err
		}
		closes[customer] = append(closes[customer], c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	appliedBy := func(customer string, at time.Time) (int64, int) {
		var sum int64
		same := 0
		for _, c := range closes[customer] {
			if !c.at.After(at) {
				sum += c.applied
			}
			if c.at.Equal(at) {
				same++
			}
		}
		return sum, same
	}

	recharges := map[string][]*ledgerTopUp{}
	bought := map[string]int{} // customer → top-ups bought through the API
	for _, t := range topUps {
		if t.source == "recharge" {
			recharges[t.customer] = append(recharges[t.customer], t)
		} else {
			bought[t.customer]++
		}
	}
	for _, customer := range sortedKeys(mergeKeys(customers, recharges)) {
		rc, list := customers[customer], recharges[customer]
		if rc == nil || rc.below == nil {
			if len(list) > 0 {
				bad("customer %s has %d recharge top-ups but no automatic recharge", customer, len(list))
			}
			continue
		}
		below, to := *rc.below, *rc.to
		if rc.expiring > 0 || rc.ended > 0 || bought[customer] > 0 {
			bad("customer %s has an automatic recharge and %d grants with an expiry, %d expired or voided entries, %d top-ups bought: "+
				"the run gives it none (the check replays its balance)", customer, rc.expiring, rc.ended, bought[customer])
			continue
		}
		if len(list) != rc.count {
			bad("customer %s: recharge_count %d, %d recharge top-ups", customer, rc.count, len(list))
		}
		byN := map[int]*ledgerTopUp{}
		for _, t := range list {
			var n int
			if _, err := fmt.Sscanf(t.topUpID, "recharge-%d", &n); err != nil || fmt.Sprintf("recharge-%d", n) != t.topUpID || n < 1 {
				bad("%s is a recharge not named recharge-<n>", t.name())
				continue
			}
			byN[n] = t
		}
		balance := rc.initial // before the closes' credits: the grants it started with, and the recharges' so far
		for n := 1; n <= max(rc.count, len(list)); n++ {
			t := byN[n]
			if t == nil {
				bad("customer %s: recharge_count %d, but no top-up recharge-%d", customer, rc.count, n)
				break
			}
			applied, closing := appliedBy(customer, t.createdAt)
			seen := balance - applied
			rollup := t.createdBy == "usage_rollup"
			switch {
			case rollup && t.amount < max(to-seen, usdMinimum):
				bad("%s, started by a roll-up, is for %d; the closes left %d (%d granted before it, %d applied), which needs at "+
					"least %d to reach %d: it did not see what the ledger held", t.name(), t.amount, seen, balance, applied,
					max(to-seen, usdMinimum), to)
			case rollup:
			case closing != 1:
				bad("%s was created at %s, when %d closes of its customer created a charge, want 1", t.name(),
					t.createdAt.UTC().Format(time.RFC3339Nano), closing)
			case seen >= below:
				bad("%s was started by a close that left %d (%d granted before it, %d applied), not below the threshold %d: "+
					"a second recharge for one crossing", t.name(), seen, balance, applied, below)
			case t.amount != max(to-seen, usdMinimum):
				bad("%s is for %d; the close left %d (%d granted before it, %d applied), which %d brings to %d: it did not see "+
					"what the ledger held", t.name(), t.amount, seen, balance, applied, max(to-seen, usdMinimum), to)
			}
			if t.status != "succeeded" {
				if n < len(list) {
					bad("%s is %s, but recharge-%d followed: nothing could have armed the recharge again", t.name(), t.status, n+1)
				}
				break
			}
			balance += t.amount
		}
		if rc.armed && rc.balance < below && rc.lastClose != nil {
			bad("customer %s is armed with %d left, below its threshold %d, after its last close: that close should have started a recharge",
				customer, rc.balance, below)
		}
	}
	return violations, nil
}

func readTopUps(ctx context.Context, conn *pgx.Conn) ([]*ledgerTopUp, error) {
	rows, err := conn.Query(ctx, `
SELECT t.id, t.customer_id, t.top_up_id, t.source, t.status, t.amount_cents, t.currency, t.top_up_key,
       coalesce(t.stripe_payment_intent_id, ''), coalesce(t.held_reason, ''), t.stripe_customer_id, t.created_at, t.created_by,
       (SELECT count(*) FROM billing.top_up_transitions x WHERE x.top_up = t.id AND x.to_status = 'succeeded'),
       (SELECT count(*) FROM billing.top_up_transitions x WHERE x.top_up = t.id AND x.to_status = 'failed')
FROM billing.top_ups t ORDER BY t.id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*ledgerTopUp, error) {
		var t ledgerTopUp
		err := row.Scan(&t.id, &t.customer, &t.topUpID, &t.source, &t.status, &t.amount, &t.currency, &t.key, &t.pi, &t.heldReason,
			&t.stripeC, &t.createdAt, &t.createdBy, &t.toSucceeded, &t.toFailed)
		return &t, err
	})
}

func readTopUpGrants(ctx context.Context, conn *pgx.Conn) ([]topUpGrant, error) {
	rows, err := conn.Query(ctx, `
SELECT customer_id, grant_id, currency, amount_cents, top_up_id FROM billing.credit_grants
WHERE top_up_id IS NOT NULL OR grant_id LIKE 'top\_up:%'`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (topUpGrant, error) {
		var g topUpGrant
		err := row.Scan(&g.customer, &g.grantID, &g.currency, &g.amount, &g.topUp)
		return g, err
	})
}

// readRechargeCustomers reads every customer's recharge settings and what
// its balance is made of; the balance is what is left of its grants that
// have not expired, summed from their entries (not from Tally's reading of
// a grant's last entry).
func readRechargeCustomers(ctx context.Context, conn *pgx.Conn) (map[string]*rechargeCustomer, error) {
	rows, err := conn.Query(ctx, `
SELECT c.customer_id, c.recharge_below_cents, c.recharge_to_cents, c.recharge_armed, c.recharge_count,
       coalesce((SELECT sum(g.amount_cents) FROM billing.credit_grants g
                 WHERE g.customer_id = c.customer_id AND g.currency = c.currency AND g.top_up_id IS NULL), 0)::bigint,
       (SELECT count(*) FROM billing.credit_grants g WHERE g.customer_id = c.customer_id AND g.expires_at IS NOT NULL),
       (SELECT count(*) FROM billing.credit_grant_entries e WHERE e.customer_id = c.customer_id AND e.kind IN ('expired', 'voided')),
       coalesce((SELECT sum(e.amount_cents) FROM billing.credit_grants g
                 JOIN billing.credit_grant_entries e ON e.customer_id = g.customer_id AND e.grant_id = g.grant_id
                 WHERE g.customer_id = c.customer_id AND g.currency = c.currency
                   AND (g.expires_at IS NULL OR g.expires_at > now())), 0)::bigint,
       (SELECT max(ch.created_at) FROM billing.charges ch WHERE ch.customer_id = c.customer_id)
FROM billing.customers c`)
	if err != nil {
		return nil, err
	}
	out := map[string]*rechargeCustomer{}
	for rows.Next() {
		var id string
		var c rechargeCustomer
		if err := rows.Scan(&id, &c.below, &c.to, &c.armed, &c.count, &c.initial, &c.expiring, &c.ended, &c.balance,
			&c.lastClose); err != nil {
			return nil, err
		}
		out[id] = &c
	}
	return out, rows.Err()
}

// ledgerTotals is, per Stripe customer, the ledger's succeeded charges and
// succeeded top-ups.
func ledgerTotals(ctx context.Context, conn *pgx.Conn) (map[string][2]int64, error) {
	rows, err := conn.Query(ctx, `
SELECT cu.stripe_customer_id,
       coalesce((SELECT sum(ch.amount_cents) FROM billing.charges ch
                 WHERE ch.customer_id = cu.customer_id AND ch.status = 'succeeded'), 0)::bigint,
       coalesce((SELECT sum(t.amount_cents) FROM billing.top_ups t
                 WHERE t.customer_id = cu.customer_id AND t.status = 'succeeded'), 0)::bigint
FROM billing.customers cu`)
	if err != nil {
		return nil, err
	}
	out := map[string][2]int64{}
	for rows.Next() {
		var c string
		var charges, topUps int64
		if err := rows.Scan(&c, &charges, &topUps); err != nil {
			return nil, err
		}
		l := out[c]
		out[c] = [2]int64{l[0] + charges, l[1] + topUps}
	}
	return out, rows.Err()
}

// notified counts the notifications of type typ the receiver took about
// top-up topUpID of customer.
func notified(got map[string]notification, typ, customer, topUpID string) int {
	n := 0
	for _, x := range got {
		if x.Type != typ {
			continue
		}
		o := x.Data.Object
		c, id := o.CustomerID, o.TopUpID
		if typ == "credit.balance_low" {
			c, id = o.TopUp.CustomerID, o.TopUp.TopUpID
		}
		if c == customer && id == topUpID {
			n++
		}
	}
	return n
}

// mergeKeys is a map with the keys of a and b.
func mergeKeys[A, B any](a map[string]A, b map[string]B) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// formatTopUps is the report's top-ups line.
func formatTopUps(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range []string{"posted", "acknowledged", "bought", "recharges", "succeeded", "failed"} {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	var rest []string
	for _, k := range sortedKeys(m) {
		switch k {
		case "posted", "acknowledged", "bought", "recharges", "succeeded", "failed", "top-ups":
			continue
		}
		rest = append(rest, fmt.Sprintf("%s=%d", k, m[k]))
	}
	sort.Strings(rest)
	s := strings.Join(parts, ", ")
	if len(rest) > 0 {
		s += " (" + strings.Join(rest, " ") + ")"
	}
	return s
}
