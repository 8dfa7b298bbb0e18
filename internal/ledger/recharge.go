package ledger

import (
	"context"
	"fmt"
	"time"
)

// Automatic recharge: a customer with recharge_below_cents and
// recharge_to_cents gets one top-up (source recharge) when a close leaves
// its credit balance in its currency below the threshold, for what brings
// the balance to recharge_to_cents. The customer's recharge_armed flag makes
// it one top-up per crossing: the close that starts a recharge clears it,
// under the customer's row lock, so a second close (another replica, a
// rescued job) finds it cleared; a grant that brings the balance back to
// the threshold (the recharge's own, once paid) sets it again.

// creditBalanceSQL is the credit balance of customer $1 in currency
// (an expression) at $2: what is left of its grants that have not expired.
const creditBalanceSQL = `(SELECT coalesce(sum(last.remaining_cents), 0)::bigint FROM billing.credit_grants g` + creditLastEntry + `
  WHERE g.customer_id = $1 AND g.currency = %s AND (g.expires_at IS NULL OR g.expires_at > $2))`

// rechargeRearmTx arms the customer's automatic recharge again when its
// balance is at or above the threshold, after a grant; the statement goes
// with the transaction's next one.
func rechargeRearmTx(tx *Tx, customerID string, now time.Time) {
	tx.execLater(nil, `
UPDATE billing.customers c SET recharge_armed = true
WHERE c.customer_id = $1 AND NOT c.recharge_armed AND c.recharge_below_cents IS NOT NULL
  AND `+fmt.Sprintf(creditBalanceSQL, "c.currency")+` >= c.recharge_below_cents`, customerID, now)
}

// rechargeCheckTx starts the customer's automatic recharge, in a close's
// transaction after its burn-down, when it is armed and the balance is below
// the threshold: it disarms it, inserts the top-up (top_up_id
// recharge-<n>, for recharge_to_cents less the balance, at least Stripe's
// minimum) with its job, and sends credit.balance_low. It returns the
// top-up, or nil when none was started.
func (l *Ledger) rechargeCheckTx(ctx context.Context, tx *Tx, now time.Time, customerID, actor string) (*TopUp, error) {
	var n int32
	var to, balance int64
	var currency string
	rows, err := tx.Query(ctx, `
UPDATE billing.customers c SET recharge_armed = false, recharge_count = c.recharge_count + 1
FROM (SELECT `+fmt.Sprintf(creditBalanceSQL, "(SELECT currency FROM billing.customers WHERE customer_id = $1)")+` AS balance) b
WHERE c.customer_id = $1 AND c.recharge_armed AND b.balance < c.recharge_below_cents
RETURNING c.recharge_count, c.recharge_to_cents, b.balance, c.currency`, customerID, now)
	if err != nil {
		return nil, fmt.Errorf("error checking automatic recharge: %w", err)
	}
	found := false
	for rows.Next() {
		if err := rows.Scan(&n, &to, &balance, &currency); err != nil {
			rows.Close()
			return nil, fmt.Errorf("error checking automatic recharge: %w", err)
		}
		found = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("error checking automatic recharge: %w", err)
	}
	if !found {
		return nil, nil
	}
	want := TopUp{CustomerID: customerID, TopUpID: fmt.Sprintf("recharge-%d", n), Source: TopUpSourceRecharge,
		AmountCents: max(to-balance, AmountMinCents(currency)), Currency: currency, Category: CreditPaid,
		Priority: CreditPriorityDefault, CreatedBy: actor}
	t, _, err := l.topUpInsertTx(ctx, tx, now, want)
	if err != nil {
		return nil, fmt.Errorf("error starting automatic recharge: %w", err)
	}
	recordNotice(tx, notice{typ: NotifyCreditBalanceLow, topUp: t.ID})
	return t, nil
}

// BalanceLow is what credit.balance_low reports: the customer's balance in
// its currency fell below its recharge threshold, and the top-up that
// recharges it.
type BalanceLow struct {
	CustomerID         string      `json:"customer_id"`
	Currency           string      `json:"currency"`
	BalanceCents       int64       `json:"balance_cents"`
	RechargeBelowCents *int64      `json:"recharge_below_cents"`
	RechargeToCents    *int64      `json:"recharge_to_cents"`
	TopUp              PublicTopUp `json:"top_up"`
}

// balanceLowTx reads credit.balance_low's object for recharge top-up t.
func balanceLowTx(ctx context.Context, tx *Tx, now time.Time, t *TopUp) (*BalanceLow, error) {
	b := &BalanceLow{CustomerID: t.CustomerID, Currency: t.Currency, TopUp: t.Public()}
	err := tx.QueryRow(ctx, `SELECT `+fmt.Sprintf(creditBalanceSQL, "$3")+`, recharge_below_cents, recharge_to_cents
FROM billing.customers WHERE customer_id = $1`, t.CustomerID, now, t.Currency).Scan(&b.BalanceCents, &b.RechargeBelowCents, &b.RechargeToCents)
	if err != nil {
		return nil, fmt.Errorf("error reading balance of customer %q to notify: %w", t.CustomerID, err)
	}
	return b, nil
}
