package ledger

import (
	"context"
	"fmt"
	"time"
)

// chargeCreateTx sums the closed period, whose currency is currency, and
// inserts its charge.
func chargeCreateTx(ctx context.Context, tx *Tx, p PeriodCloseParams, namespace, currency string, now time.Time) (*Charge, error) {
	// Earlier charges carried forward (below Stripe's minimum) are billed
	// with this one: read (and locked) with the sum, in its round trip.
	carriedIn := chargeCarriedInTx(tx, p.CustomerID, currency)
	var count, total int64
	var stripeCustomer string
	var paymentMethod *string
	var startsAt time.Time
	err := tx.QueryRow(ctx, `
SELECT count(e.id), coalesce(sum(e.amount_cents), 0)::bigint, p.starts_at,
       c.stripe_customer_id, c.stripe_payment_method_id
FROM billing.periods p
JOIN billing.customers c ON c.customer_id = p.customer_id
LEFT JOIN billing.usage_events e ON e.customer_id = p.customer_id AND e.period = p.period
WHERE p.customer_id = $1 AND p.period = $2
GROUP BY p.starts_at, c.stripe_customer_id, c.stripe_payment_method_id`,
		p.CustomerID, p.Period).Scan(&count, &total, &startsAt, &stripeCustomer, &paymentMethod)
	if err != nil {
		return nil, fmt.Errorf("error summing period: %w", err)
	}
	in, err := carriedIn.get(ctx) // read with the sum
	if err != nil {
		return nil, err
	}
	carriedIDs, carried := in.ids, in.total
	// The guards (Stripe's limits, cap, budget, anomaly) are checked when the
	// charge is first claimed, in the transaction that reserves its budget.
	status := ChargePending
	if total+carried == 0 && !p.paidOnStripe {
		status = ChargeSkipped
	}
	charge, err := scanCharge(tx.QueryRow(ctx, `
INSERT INTO billing.charges (customer_id, period, status, amount_cents, currency, event_count,
                             stripe_customer_id, stripe_payment_method_id, charge_key, idempotency_key,
                             period_starts_at, carried_in_cents, key_namespace, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14)
RETURNING `+chargeColumns,
		p.CustomerID, p.Period, status, total+carried, currency, count, stripeCustomer, paymentMethod,
		ChargeKey(namespace, p.CustomerID, p.Period), ChargeIdempotencyKey(namespace, p.CustomerID, p.Period, 0),
		startsAt, carried, namespace, now))
	if err != nil {
		return nil, fmt.Errorf("error creating charge: %w", err)
	}
	reason := fmt.Sprintf("closed with %d events totalling %d %s", count, total, currency)
	if carried > 0 {
		reason += fmt.Sprintf(", plus %d carried from charges %v", carried, carriedIDs)
	}
	if err := transitionTx(ctx, tx, now, charge.ID, nil, status, p.Actor, reason); err != nil {
		return nil, err
	}
	if err := chargeCarriedIntoTx(ctx, tx, now, carriedIDs, charge.ID, p.Actor); err != nil {
		return nil, err
	}
	return charge, nil
}
