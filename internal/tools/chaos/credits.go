package chaos

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// Prepaid customers: about one customer in ten holds credit grants, given
// before the load (so they cover the run's current period, which ends after
// them; the two past periods ended before any grant and are not covered).
// Some grants cover only api_calls, and some expire during the run (the
// sweep writes what is left of them off). The check (checkCredits) holds
// the burn-down to its promise: a grant never applies more than it has,
// each application is one credit line of one charge of the grant's
// customer, and a charge left to pay by card had no unscoped grant valid
// for it with anything left. Some prepaid customers also buy top-ups or
// have an automatic recharge (topups.go): the grants those buy are checked
// here too, and against Stripe in checkTopUps.

// prepaidCustomer reports whether customer i holds credits: not one of the
// customers whose card fails on purpose (their expectations assume every
// charge reaches Stripe).
func prepaidCustomer(i int) bool {
	return i%10 == 3 && i%40 != 7 && i%40 != 19 && i%40 != 31 && i%80 != 13
}

// grantCredits gives customer i (id) its grants, deterministic in i.
func (r *run) grantCredits(ctx context.Context, i int, id string) error {
	for _, g := range creditGrants(i, time.Now()) {
		ans, err := r.producer.do(ctx, http.MethodPost, "/v1/customers/"+id+"/credit-grants", i%2, g)
		if err != nil {
			return err
		}
		if ans.status/100 != 2 {
			return fmt.Errorf("POST /v1/customers/%s/credit-grants answered %d %s", id, ans.status, ans.code)
		}
		r.fault("credit grant")
	}
	return nil
}

// creditGrants are the grants of customer i, given at now.
func creditGrants(i int, now time.Time) []map[string]any {
	grants := []map[string]any{{
		"grant_id": "g-main", "amount_cents": 300 + (i*37)%2500, "currency": "usd", "category": "promotional",
	}}
	if i%20 == 13 {
		grants[0]["amount_cents"] = 1_000_000 // covers every charge it is valid for
	}
	if i%20 == 3 {
		grants[0]["category"] = "paid"
	}
	if planCustomer(i) {
		grants = append(grants, map[string]any{"grant_id": "g-api", "amount_cents": 500, "currency": "usd",
			"category": "promotional", "priority": 10, "metrics": []string{"api_calls"}})
	}
	if expiringGrant(i) {
		grants = append(grants, map[string]any{"grant_id": "g-expiring", "amount_cents": 400, "currency": "usd",
			"category": "promotional", "priority": 0, "expires_at": now.Add(20 * time.Second).UTC().Format(time.RFC3339)})
	}
	return grants
}

// checkCredits checks every grant's entries and every charge's credits,
// and counts what it checked: grants, applied and expired entries.
func checkCredits(ctx context.Context, conn *pgx.Conn) ([]string, map[string]int, error) {
	var violations []string
	bad := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	counts := map[string]int{}

	// Each grant: its granted entry is its amount, once; what is left never
	// below zero; an expiry only after expires_at, taking all that was left.
	rows, err := conn.Query(ctx, `
SELECT g.customer_id, g.grant_id, g.amount_cents,
       coalesce(sum(e.amount_cents) FILTER (WHERE e.kind = 'granted'), 0)::bigint,
       count(*) FILTER (WHERE e.kind = 'granted'),
       coalesce(sum(e.amount_cents), 0)::bigint,
       count(*) FILTER (WHERE e.kind = 'applied'),
       count(*) FILTER (WHERE e.kind = 'expired'),
       bool_and(e.kind <> 'expired' OR e.created_at >= g.expires_at)
FROM billing.credit_grants g
JOIN billing.credit_grant_entries e ON e.customer_id = g.customer_id AND e.grant_id = g.grant_id
GROUP BY g.customer_id, g.grant_id, g.amount_cents`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var customer, grant string
		var amount, granted, left int64
		var grants, applied, expired int
		var expiredAfter bool
		if err := rows.Scan(&customer, &grant, &amount, &granted, &grants, &left, &applied, &expired, &expiredAfter); err != nil {
			return nil, nil, err
		}
		of := fmt.Sprintf("grant %s of %s", grant, customer)
		counts["grants"]++
		counts["applied"] += applied
		counts["expired"] += expired
		switch {
		case grants != 1 || granted != amount:
			bad("%s of %d has %d granted entries for %d", of, amount, grants, granted)
		case left < 0:
			bad("%s of %d was applied past its amount: %d left", of, amount, left)
		case expired > 0 && (left != 0 || !expiredAfter):
			bad("%s expired with %d left, or before its expires_at", of, left)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}

	// Each applied entry is one credit line of a charge of the grant's
	// customer, of the same amount, and each credit line is an entry.
	var unmatched int
	var example string
	err = conn.QueryRow(ctx, `
SELECT count(*), coalesce(min(coalesce(e.grant_id, l.grant_id) || ' charge ' || coalesce(e.charge_id, l.charge_id)), '')
FROM (SELECT e.* FROM billing.credit_grant_entries e WHERE e.kind = 'applied') e
FULL JOIN (SELECT l.charge_id, l.grant_id, l.amount_cents, c.customer_id FROM billing.charge_lines l
           JOIN billing.charges c ON c.id = l.charge_id WHERE l.kind = 'credit') l
  ON l.charge_id = e.charge_id AND l.grant_id = e.grant_id AND l.customer_id = e.customer_id
WHERE e.id IS NULL OR l.charge_id IS NULL OR l.amount_cents <> e.amount_cents`).Scan(&unmatched, &example)
	if err != nil {
		return nil, nil, err
	}
	if unmatched > 0 {
		bad("%d applied entries and credit lines do not match one to one (first: grant %s)", unmatched, example)
	}

	// Each grant's entries follow one another, each with what is left
	// after it.
	var breaks int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM billing.credit_chain_breaks`).Scan(&breaks); err != nil {
		return nil, nil, err
	}
	if breaks > 0 {
		bad("%d credit entries break their grant's chain (billing.credit_chain_breaks)", breaks)
	}

	// A grant pays only for charges it was valid for: of its currency, of
	// periods that ended (or closed early) after it was granted and before
	// it expired.
	var invalid int
	err = conn.QueryRow(ctx, `
SELECT count(*)
FROM billing.charge_lines l
JOIN billing.charges c ON c.id = l.charge_id
JOIN billing.periods p ON p.customer_id = c.customer_id AND p.period = c.period
JOIN billing.credit_grants g ON g.customer_id = c.customer_id AND g.grant_id = l.grant_id
WHERE l.kind = 'credit'
  AND (g.currency <> c.currency OR g.created_at > least(p.ends_at, c.created_at)
       OR g.expires_at <= least(p.ends_at, c.created_at))`).Scan(&invalid)
	if err != nil {
		return nil, nil, err
	}
	if invalid > 0 {
		bad("%d credit lines apply grants that were not valid when their period ended", invalid)
	}

	// A scoped grant pays for nothing but its metrics' usage lines.
	rows, err = conn.Query(ctx, `
SELECT l.charge_id, l.grant_id, -l.amount_cents,
       coalesce((SELECT sum(u.amount_cents) FROM billing.charge_lines u
                 WHERE u.charge_id = l.charge_id AND u.kind = 'usage' AND u.metric = ANY (g.metrics)), 0)::bigint
FROM billing.charge_lines l
JOIN billing.charges c ON c.id = l.charge_id
JOIN billing.credit_grants g ON g.customer_id = c.customer_id AND g.grant_id = l.grant_id
WHERE l.kind = 'credit' AND g.metrics IS NOT NULL`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var charge int64
		var grant string
		var credit, covered int64
		if err := rows.Scan(&charge, &grant, &credit, &covered); err != nil {
			return nil, nil, err
		}
		if credit > covered {
			bad("charge %d: scoped grant %s paid %d, more than its metrics' lines (%d)", charge, grant, credit, covered)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}

	// A charge left to pay by card had no unscoped grant valid when its
	// period ended with anything left: what a grant has left at the end of
	// the run, expiries aside, it had at every close before.
	rows, err = conn.Query(ctx, `
SELECT c.id, c.customer_id, c.period, c.status, c.amount_cents, g.grant_id,
       g.amount_cents + coalesce((SELECT sum(e.amount_cents) FROM billing.credit_grant_entries e
                                  WHERE e.customer_id = g.customer_id AND e.grant_id = g.grant_id AND e.kind = 'applied'), 0)
FROM billing.charges c
JOIN billing.periods p ON p.customer_id = c.customer_id AND p.period = c.period
JOIN billing.credit_grants g ON g.customer_id = c.customer_id AND g.currency = c.currency AND g.metrics IS NULL
WHERE c.amount_cents > 0
  AND g.created_at <= least(p.ends_at, c.created_at)
  AND (g.expires_at IS NULL OR g.expires_at > least(p.ends_at, c.created_at))`)
	if err != nil {
		return nil, nil, err
	}
	for rows.Next() {
		var id, amount, left int64
		var customer, period, status, grant string
		if err := rows.Scan(&id, &customer, &period, &status, &amount, &grant, &left); err != nil {
			return nil, nil, err
		}
		if left > 0 {
			bad("charge %d of %s/%s is %s for %d though grant %s, valid for it, has %d unapplied", id, customer, period, status,
				amount, grant, left)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	return violations, counts, nil
}
