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

// check compares, independently of Tally's code, the promoted standby's
// ledger with the simulator's PaymentIntents and the producers'
// acknowledgements, and fills the report. quiet is the quiescence error, a
// violation itself.
func (f *failover) check(ctx context.Context, quiet error) error {
	conn, err := pgx.Connect(ctx, f.db.tallyURL())
	if err != nil {
		return fmt.Errorf("error connecting to the promoted standby: %w", err)
	}
	defer conn.Close(context.Background())
	pis, err := f.stack.control.PaymentIntentList(ctx)
	if err != nil {
		return fmt.Errorf("error listing the simulator's PaymentIntents: %w", err)
	}
	if stats, err := f.stack.control.Stats(ctx); err == nil {
		f.report.StripeRequests = stats.Requests
	}
	f.ackMu.Lock()
	acked := make(map[string]ackedEvent, len(f.acked))
	for k, amount := range f.acked {
		acked[k] = ackedEvent{amount: amount, at: f.ackedAt[k]}
	}
	f.ackMu.Unlock()
	var killAt time.Time
	if k := f.killAt.Load(); k != nil {
		killAt = *k
	}
	if quiet != nil {
		f.report.Violations = append(f.report.Violations, quiet.Error())
	}
	return checkFailover(ctx, conn, pis, acked, f.stallAt, killAt, f.cfg.Sync, f.report)
}

// ackedEvent is an event a producer got a 2xx for, and when.
type ackedEvent struct {
	amount int64
	at     time.Time
}

// checkFailover checks the promise after a failover and fills report
// (events acknowledged between stallAt and killAt are counted apart):
//
//   - no (customer, period) has more than one succeeded PaymentIntent (by
//     metadata customer_id and period) — the core promise;
//   - no charge is left pending, unknown or processing, and every period
//     with events has a charge;
//   - a succeeded charge names the one succeeded PaymentIntent of its
//     (customer, period), whose amount is the ledger's sum; a succeeded
//     PaymentIntent belongs to a succeeded or held charge (money the ledger
//     does not show is a violation);
//   - held charges are counted by reason, not flagged;
//   - an acknowledged event missing from the ledger is counted, and is a
//     violation when sync is set (synchronous replication must lose
//     nothing); one stored with another amount is always a violation.
func checkFailover(ctx context.Context, conn *pgx.Conn, pis []*stripe.PaymentIntent, acked map[string]ackedEvent, stallAt, killAt time.Time, sync bool, report *FailoverReport) error {
	bad := func(format string, args ...any) {
		report.Violations = append(report.Violations, fmt.Sprintf(format, args...))
	}
	type key struct{ customer, period string }

	stored := map[string]int64{}
	sums := map[key]int64{}
	// Every event is kept (stored); a period's sum counts those not voided
	// (billing.usage_events_counted).
	rows, err := conn.Query(ctx, `
SELECT e.customer_id, e.event_id, e.period, e.amount_cents, c.event_id IS NOT NULL
FROM billing.usage_events e LEFT JOIN billing.usage_events_counted c USING (customer_id, event_id)`)
	if err != nil {
		return fmt.Errorf("error reading usage events: %w", err)
	}
	for rows.Next() {
		var k key
		var id string
		var amount int64
		var counted bool
		if err := rows.Scan(&k.customer, &id, &k.period, &amount, &counted); err != nil {
			return fmt.Errorf("error reading usage events: %w", err)
		}
		stored[k.customer+"/"+id] = amount
		if counted {
			sums[k] += amount
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("error reading usage events: %w", err)
	}
	report.EventsAcked = len(acked)
	var lost []string
	for k, a := range acked {
		if !stallAt.IsZero() && !a.at.Before(stallAt) && (killAt.IsZero() || a.at.Before(killAt)) {
			report.EventsAckedInStall++
		}
		got, ok := stored[k]
		switch {
		case !ok:
			lost = append(lost, k)
		case got != a.amount:
			bad("event %s acknowledged with amount %d is stored with %d", k, a.amount, got)
		}
	}
	sort.Strings(lost)
	report.EventsLost = len(lost)
	if sync {
		for i, k := range lost {
			if i == 20 {
				bad("… and %d more acknowledged events lost", len(lost)-20)
				break
			}
			bad("event %s got a 2xx but is not in the ledger after a synchronous failover", k)
		}
	}

	type charge struct {
		status, pi, heldReason string
		amount                 int64
	}
	charges := map[key]charge{}
	report.Charges, report.HeldReasons, report.HeldExamples = map[string]int{}, map[string]int{}, map[string]string{}
	rows, err = conn.Query(ctx, `
SELECT customer_id, period, status, amount_cents, coalesce(stripe_payment_intent_id, ''), coalesce(held_reason, '')
FROM billing.charges`)
	if err != nil {
		return fmt.Errorf("error reading charges: %w", err)
	}
	for rows.Next() {
		var k key
		var c charge
		if err := rows.Scan(&k.customer, &k.period, &c.status, &c.amount, &c.pi, &c.heldReason); err != nil {
			return fmt.Errorf("error reading charges: %w", err)
		}
		charges[k] = c
		report.Charges[c.status]++
		if c.status == "held" {
			class := heldReasonClass(c.heldReason)
			report.HeldReasons[class]++
			if _, ok := report.HeldExamples[class]; !ok {
				report.HeldExamples[class] = c.heldReason
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("error reading charges: %w", err)
	}

	succeeded := map[key][]*stripe.PaymentIntent{}
	report.PaymentIntents = len(pis)
	for _, pi := range pis {
		if pi.Status != stripe.PaymentIntentStatusSucceeded {
			continue
		}
		report.PaymentIntentsSucceeded++
		k := key{pi.Metadata["customer_id"], pi.Metadata["period"]}
		succeeded[k] = append(succeeded[k], pi)
	}

	keys := make([]key, 0, len(sums)+len(succeeded))
	seen := map[key]bool{}
	for _, m := range []map[key]bool{keysOf(sums), keysOf(succeeded), keysOf(charges)} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].customer+keys[i].period < keys[j].customer+keys[j].period })
	for _, k := range keys {
		mine := succeeded[k]
		ids := make([]string, len(mine))
		for i, pi := range mine {
			ids[i] = pi.ID
		}
		if len(mine) > 1 {
			report.DoubleCharged = append(report.DoubleCharged, fmt.Sprintf("%s/%s: %s", k.customer, k.period, strings.Join(ids, ", ")))
			bad("%s/%s has %d succeeded PaymentIntents: %s", k.customer, k.period, len(mine), strings.Join(ids, ", "))
		}
		sum, hasEvents := sums[k]
		for _, pi := range mine {
			if !hasEvents {
				bad("succeeded PaymentIntent %s is for %s/%s, which has no events in the ledger", pi.ID, k.customer, k.period)
			} else if pi.Amount != sum {
				bad("succeeded PaymentIntent %s of %s/%s is for %d; the ledger sums to %d", pi.ID, k.customer, k.period, pi.Amount, sum)
			}
		}
		c, hasCharge := charges[k]
		switch {
		case !hasCharge && hasEvents:
			bad("%s/%s has events totalling %d and no charge", k.customer, k.period, sum)
		case !hasCharge:
			bad("%s/%s has succeeded PaymentIntents %s and no charge", k.customer, k.period, strings.Join(ids, ", "))
		case !hasEvents && c.status != "skipped" && c.status != "canceled":
			bad("charge of %s/%s is %s for %d but the period has no events", k.customer, k.period, c.status, c.amount)
		case c.status == "pending" || c.status == "unknown" || c.status == "processing" || c.status == "past_due":
			bad("charge of %s/%s is still %s", k.customer, k.period, c.status)
		case c.status == "held":
			// Counted by reason; a double charge behind it is flagged above.
		case c.status == "succeeded":
			if len(mine) != 1 || mine[0].ID != c.pi {
				bad("succeeded charge of %s/%s names PaymentIntent %q; the simulator's succeeded ones are [%s]",
					k.customer, k.period, c.pi, strings.Join(ids, ", "))
			}
		case len(mine) > 0:
			bad("charge of %s/%s is %s but PaymentIntents %s succeeded", k.customer, k.period, c.status, strings.Join(ids, ", "))
		}
	}
	return nil
}

// heldReasonClass is the part of a held reason before its first colon (the
// rest often names a key or an id), at most 60 characters.
func heldReasonClass(reason string) string {
	if i := strings.Index(reason, ":"); i > 0 {
		reason = reason[:i]
	}
	if len(reason) > 60 {
		reason = reason[:60]
	}
	if reason == "" {
		reason = "(none)"
	}
	return reason
}

func keysOf[K comparable, V any](m map[K]V) map[K]bool {
	out := make(map[K]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}
