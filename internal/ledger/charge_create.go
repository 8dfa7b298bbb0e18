package ledger

import (
	"context"
	"fmt"
	"time"
)

// chargeCreateTx rates the closed period, whose currency is currency, into
// lines (charge_line.go), applies the customer's credits to them
// (credit_burn.go) and inserts its charge, whose amount is the sum of its
// lines, with them: pending, or covered when credits paid a positive total
// whole, or skipped when there was nothing to pay. recharge reports that the
// customer's automatic recharge is armed (recharge.go): the caller checks
// its balance once the burn-down is written.
func chargeCreateTx(ctx context.Context, tx *Tx, p PeriodCloseParams, namespace, currency string, now time.Time) (
	_ *Charge, recharge bool, _ error) {
	// The events, and earlier charges carried forward (below Stripe's
	// minimum), which are billed with this one: read (and locked) with the
	// period's row, in its round trip.
	usage := periodUsageTx(tx, p.CustomerID, p.Period)
	carriedIn := chargeCarriedInTx(tx, p.CustomerID, currency)
	grants := creditsAvailableTx(tx, p.CustomerID, p.Period, currency, now)
	var stripeCustomer string
	var paymentMethod *string
	var startsAt time.Time
	var plan periodPlan
	var planID *string
	var planVersion *int32
	err := tx.QueryRow(ctx, `
SELECT p.starts_at, c.stripe_customer_id, c.stripe_payment_method_id, p.plan_id, p.plan_version, v.price_book,
       c.recharge_armed AND c.recharge_below_cents IS NOT NULL AND c.currency = p.currency
FROM billing.periods p
JOIN billing.customers c ON c.customer_id = p.customer_id
LEFT JOIN billing.plan_versions v ON v.plan_id = p.plan_id AND v.version = p.plan_version
WHERE p.customer_id = $1 AND p.period = $2`,
		p.CustomerID, p.Period).Scan(&startsAt, &stripeCustomer, &paymentMethod, &planID, &planVersion, &plan.book, &recharge)
	if err != nil {
		return nil, false, fmt.Errorf("error reading period: %w", err)
	}
	if planID != nil && planVersion != nil {
		plan.id, plan.version = *planID, *planVersion
	}
	u, err := usage.get(ctx) // read with the period
	if err != nil {
		return nil, false, err
	}
	in, err := carriedIn.get(ctx)
	if err != nil {
		return nil, false, err
	}
	carriedIDs, carried := in.ids, in.total
	lines, rated, err := rateLines(u, plan, carried)
	if err != nil {
		return nil, false, fmt.Errorf("error rating period: %w", err)
	}
	usageThresholdsAtCloseTx(tx, now, p.CustomerID, p.Period, currency, rated-carried)
	available, err := grants.get(ctx)
	if err != nil {
		return nil, false, err
	}
	credits, covered := applyCredits(lines, available)
	lines, total := append(lines, credits...), rated-covered
	// The guards (Stripe's limits, cap, budget, anomaly) are checked when the
	// charge is first claimed, in the transaction that reserves its budget.
	status := ChargePending
	switch {
	case total > 0 || p.paidOnStripe:
	case rated > 0:
		status = ChargeCovered
	default:
		status = ChargeSkipped
	}
	charge, err := scanCharge(tx.QueryRow(ctx, `
INSERT INTO billing.charges (customer_id, period, status, amount_cents, currency, event_count,
                             stripe_customer_id, stripe_payment_method_id, charge_key, idempotency_key,
                             period_starts_at, carried_in_cents, key_namespace, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14)
RETURNING `+chargeColumns,
		p.CustomerID, p.Period, status, total, currency, u.events, stripeCustomer, paymentMethod,
		ChargeKey(namespace, p.CustomerID, p.Period), ChargeIdempotencyKey(namespace, p.CustomerID, p.Period, 0),
		startsAt, carried, namespace, now))
	if err != nil {
		return nil, false, fmt.Errorf("error creating charge: %w", err)
	}
	if err := chargeLinesInsertTx(tx, charge.ID, charge.CustomerID, lines, now); err != nil {
		return nil, false, err
	}
	creditsAppliedInsertTx(tx, p.CustomerID, charge.ID, credits, available, p.Actor, now)
	reason := fmt.Sprintf("closed with %d events totalling %d %s", u.events, rated-carried, currency)
	if len(u.metrics) > 0 {
		reason += fmt.Sprintf(" (%d metrics rated with version %d of plan %s)", len(u.metrics), plan.version, plan.id)
	}
	if carried > 0 {
		reason += fmt.Sprintf(", plus %d carried from charges %v", carried, carriedIDs)
	}
	if covered > 0 {
		reason += fmt.Sprintf(", less %d of credits from %d grants", covered, len(credits))
	}
	if err := transitionTx(ctx, tx, now, charge.ID, charge.CustomerID, nil, status, p.Actor, reason); err != nil {
		return nil, false, err
	}
	if err := chargeCarriedIntoTx(ctx, tx, now, carriedIDs, charge.ID, charge.CustomerID, p.Actor); err != nil {
		return nil, false, err
	}
	return charge, recharge, nil
}
