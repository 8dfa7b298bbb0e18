package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Customer is a billable customer, keyed by the producer's own id.
type Customer struct {
	ID                    string
	StripeCustomerID      string
	StripePaymentMethodID *string
	Currency              string
	MaxChargeCents        *int64
	CreatedAt             time.Time
	UpdatedAt             time.Time

	// UsageAlertThresholdsCents are levels of a period's rated total so far
	// that send usage.threshold_reached once each (UsageRollup, and the
	// close), ascending.
	UsageAlertThresholdsCents []int64

	// PlanID is the customer's plan, in its currency: its latest version
	// when a period opens prices that period. Nil: none.
	PlanID *string

	// RechargeBelowCents and RechargeToCents are the customer's automatic
	// recharge (recharge.go): when a close leaves its credit balance below
	// RechargeBelowCents, a top-up brings it to RechargeToCents. Nil: none.
	RechargeBelowCents *int64
	RechargeToCents    *int64

	// CarriedForwardCents is what the customer's charges below Stripe's
	// minimum carry forward, per currency, not yet billed by a later charge
	// (set by CustomerGet).
	CarriedForwardCents map[string]int64
}

// CustomerPutParams are the fields of CustomerPut.
type CustomerPutParams struct {
	ID                    string
	StripeCustomerID      string
	StripePaymentMethodID *string // optional; nil: the Stripe customer's default payment method
	Currency              string  // ISO 4217, case-insensitive; stored lower-case
	MaxChargeCents        *int64  // optional cap per period; nil: none

	// UsageAlertThresholdsCents are the levels of a period's total to be
	// told of (usage.threshold_reached); nil or empty: none. Stored sorted,
	// without repeats.
	UsageAlertThresholdsCents []int64

	// PlanID puts the customer on a plan, which must exist and be in the
	// customer's currency; nil: none. A change applies from the customer's
	// next period: each period keeps the plan version it opened with.
	PlanID *string

	// RechargeBelowCents and RechargeToCents set the automatic recharge;
	// both or neither, RechargeToCents above RechargeBelowCents. A change
	// arms it again (one top-up per crossing of the new threshold).
	RechargeBelowCents *int64
	RechargeToCents    *int64
}

func (p *CustomerPutParams) validate() error {
	fe := fieldErrors{}
	checkID(fe, "customer_id", p.ID, true)
	checkID(fe, "stripe_customer_id", p.StripeCustomerID, true)
	if p.StripePaymentMethodID != nil {
		checkID(fe, "stripe_payment_method_id", *p.StripePaymentMethodID, true)
	}
	checkCurrency(fe, "currency", p.Currency)
	if m := p.MaxChargeCents; m != nil && (*m <= 0 || *m > AmountCentsMax) {
		fe.add("max_charge_cents", "must be between 1 and %d, or omitted for no cap", AmountCentsMax)
	}
	if p.PlanID != nil {
		checkID(fe, "plan_id", *p.PlanID, true)
	}
	switch b, t := p.RechargeBelowCents, p.RechargeToCents; {
	case (b == nil) != (t == nil):
		fe.add("recharge_to_cents", "and recharge_below_cents go together: send both for an automatic recharge, or neither")
	case b != nil && (*b <= 0 || *b >= AmountMaxCents):
		fe.add("recharge_below_cents", "must be between 1 and %d", AmountMaxCents-1)
	case b != nil && (*t <= *b || *t > AmountMaxCents):
		fe.add("recharge_to_cents", "must be above recharge_below_cents (%d) and at most %d, Stripe's largest PaymentIntent", *b, AmountMaxCents)
	}
	if len(p.UsageAlertThresholdsCents) > UsageThresholdsMax {
		fe.add("usage_alert_thresholds_cents", "has %d thresholds; send at most %d", len(p.UsageAlertThresholdsCents), UsageThresholdsMax)
	}
	for _, t := range p.UsageAlertThresholdsCents {
		if t <= 0 || t > AmountCentsMax {
			fe.add("usage_alert_thresholds_cents", "each threshold must be between 1 and %d; got %d", AmountCentsMax, t)
		}
	}
	return fe.err()
}

const customerColumns = `customer_id, stripe_customer_id, stripe_payment_method_id, currency,
       max_charge_cents, created_at, updated_at, usage_alert_thresholds_cents, plan_id, recharge_below_cents,
       recharge_to_cents`

func scanCustomer(row pgx.Row, extra ...any) (*Customer, error) {
	var c Customer
	dest := append([]any{&c.ID, &c.StripeCustomerID, &c.StripePaymentMethodID, &c.Currency,
		&c.MaxChargeCents, &c.CreatedAt, &c.UpdatedAt, &c.UsageAlertThresholdsCents, &c.PlanID, &c.RechargeBelowCents, &c.RechargeToCents}, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	return &c, nil
}

// CustomerPut creates the customer or replaces its fields, and reports
// whether it was created. A currency or plan change applies to periods
// created afterwards; open periods keep the currency and the plan version
// they started with. It returns a *ValidationError for bad fields, naming
// plan_id for an unknown plan or one in another currency.
func (l *Ledger) CustomerPut(ctx context.Context, p CustomerPutParams) (*Customer, bool, error) {
	p.Currency = strings.ToLower(p.Currency)
	if err := p.validate(); err != nil {
		return nil, false, err
	}
	if p.PlanID != nil {
		// A plan is never removed and its currency never changes: what this
		// read finds holds when the customer is written.
		if err := l.customerPlanCheck(ctx, *p.PlanID, p.Currency); err != nil {
			return nil, false, err
		}
	}
	thresholds := slices.Compact(slices.Sorted(slices.Values(p.UsageAlertThresholdsCents)))
	if thresholds == nil {
		thresholds = []int64{}
	}
	var created bool
	c, err := scanCustomer(l.pool.QueryRow(ctx, `
INSERT INTO billing.customers AS c (customer_id, stripe_customer_id, stripe_payment_method_id,
                                    currency, max_charge_cents, usage_alert_thresholds_cents, plan_id, created_at, updated_at,
                                    recharge_below_cents, recharge_to_cents)
VALUES ($1, $2, $3, $4, $5, $7, $8, $6, $6, $9, $10)
ON CONFLICT (customer_id) DO UPDATE
SET stripe_customer_id = excluded.stripe_customer_id,
    stripe_payment_method_id = excluded.stripe_payment_method_id,
    currency = excluded.currency,
    max_charge_cents = excluded.max_charge_cents,
    usage_alert_thresholds_cents = excluded.usage_alert_thresholds_cents,
    plan_id = excluded.plan_id,
    recharge_armed = c.recharge_armed OR c.recharge_below_cents IS DISTINCT FROM excluded.recharge_below_cents
                     OR c.recharge_to_cents IS DISTINCT FROM excluded.recharge_to_cents,
    recharge_below_cents = excluded.recharge_below_cents,
    recharge_to_cents = excluded.recharge_to_cents,
    updated_at = excluded.updated_at
RETURNING `+customerColumns+`, (xmax = 0)`,
		p.ID, p.StripeCustomerID, p.StripePaymentMethodID, p.Currency, p.MaxChargeCents, l.now(), thresholds, p.PlanID,
		p.RechargeBelowCents, p.RechargeToCents), &created)
	if err != nil {
		return nil, false, fmt.Errorf("error saving customer %s: %w", p.ID, err)
	}
	return c, created, nil
}

// CustomerGet returns the customer, or ErrNotFound.
func (l *Ledger) CustomerGet(ctx context.Context, id string) (*Customer, error) {
	if !ValidID(id) {
		return nil, notFound("customer %q", id)
	}
	c, err := scanCustomer(l.pool.QueryRow(ctx, `SELECT `+customerColumns+`
FROM billing.customers WHERE customer_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("customer %q", id)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading customer %s: %w", id, err)
	}
	rows, err := l.pool.Query(ctx, `SELECT currency, carried_cents FROM billing.customer_carried_forward WHERE customer_id = $1`, id)
	if err != nil {
		return nil, fmt.Errorf("error reading carried amounts of customer %s: %w", id, err)
	}
	c.CarriedForwardCents = map[string]int64{}
	for rows.Next() {
		var currency string
		var cents int64
		if err := rows.Scan(&currency, &cents); err != nil {
			return nil, fmt.Errorf("error reading carried amounts of customer %s: %w", id, err)
		}
		c.CarriedForwardCents[currency] = cents
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("error reading carried amounts of customer %s: %w", id, err)
	}
	return c, nil
}

// customerPlanCheck returns a *ValidationError naming plan_id unless plan
// planID exists in currency.
func (l *Ledger) customerPlanCheck(ctx context.Context, planID, currency string) error {
	var planCurrency string
	err := l.pool.QueryRow(ctx, `SELECT currency FROM billing.plans WHERE plan_id = $1`, planID).Scan(&planCurrency)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return &ValidationError{Fields: map[string]string{"plan_id": fmt.Sprintf(
			"unknown plan %q: create it with PUT /v1/plans/{plan_id} first, or omit plan_id for none", planID)}}
	case err != nil:
		return fmt.Errorf("error reading plan %s: %w", planID, err)
	case planCurrency != currency:
		return &ValidationError{Fields: map[string]string{"plan_id": fmt.Sprintf(
			"plan %q is in %s, and the customer in %s: name a plan in %s (a plan's currency is fixed by its first version)",
			planID, planCurrency, currency, currency)}}
	}
	return nil
}
