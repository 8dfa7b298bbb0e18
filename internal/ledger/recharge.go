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

// rechargeCheckTx starts the customer's automatic recharge when it is armed
// and the balance, less projectedCents, is below the threshold: in a
// close's transaction after its burn-down (projectedCents 0), or in a usage
// roll-up's with the rated total of the customer's open period (what its
// close will burn down). It disarms it, inserts the top-up (top_up_id
// recharge-<n>, for recharge_to_cents less that projected balance, at least
// Stripe's minimum) with its job, and sends credit.balance_low. It returns
// the top-up, or nil when none was started.
func (l *Ledger) rechargeCheckTx(ctx context.Context, tx *Tx, now time.Time, customerID, actor string, projectedCents int64) (*TopUp, error) {
	var n int32
	var to, balance int64
	var currency string
	rows, err := tx.Query(ctx, `
UPDATE billing.customers c SET recharge_armed = false, recharge_count = c.recharge_count + 1
FROM (SELECT `+fmt.Sprintf(creditBalanceSQL, "(SELECT currency FROM billing.customers WHERE customer_id = $1)")+` - $3 AS balance) b
WHERE c.customer_id = $1 AND c.recharge_armed AND b.balance < c.recharge_below_cents
RETURNING c.recharge_count, c.recharge_to_cents, b.balance, c.currency`, customerID, now, projectedCents)
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
	want := TopUp{CustomerID: customerID, TopUpID: fmt.Sprintf("%s%d", TopUpRechargePrefix, n), Source: TopUpSourceRecharge,
		AmountCents: min(max(to-balance, AmountMinCents(currency)), AmountMaxCents), Currency: currency, Category: CreditPaid,
		Priority: CreditPriorityDefault, CreatedBy: actor}
	t, _, err := l.topUpInsertTx(ctx, tx, now, want)
	if err != nil {
		return nil, fmt.Errorf("error starting automatic recharge: %w", err)
	}
	recordNotice(tx, notice{typ: NotifyCreditBalanceLow, topUp: t.ID, balance: balance})
	return t, nil
}

// BalanceLow is what credit.balance_low reports: the customer's balance in
// its currency fell (or its open period's usage projects it) below its
// recharge threshold, and the top-up that recharges it. BalanceCents is
// the balance that crossed: what is left of its grants, less the rated
// usage of its open period when a roll-up projected it.
type BalanceLow struct {
	CustomerID         string      `json:"customer_id"`
	Currency           string      `json:"currency"`
	BalanceCents       int64       `json:"balance_cents"`
	RechargeBelowCents *int64      `json:"recharge_below_cents"`
	RechargeToCents    *int64      `json:"recharge_to_cents"`
	TopUp              PublicTopUp `json:"top_up"`
}

// balanceLowTx reads credit.balance_low's object for recharge top-up t,
// started when the balance was balance.
func balanceLowTx(ctx context.Context, tx *Tx, t *TopUp, balance int64) (*BalanceLow, error) {
	b := &BalanceLow{CustomerID: t.CustomerID, Currency: t.Currency, BalanceCents: balance, TopUp: t.Public()}
	err := tx.QueryRow(ctx, `SELECT recharge_below_cents, recharge_to_cents FROM billing.customers WHERE customer_id = $1`,
		t.CustomerID).Scan(&b.RechargeBelowCents, &b.RechargeToCents)
	if err != nil {
		return nil, fmt.Errorf("error reading recharge of customer %q to notify: %w", t.CustomerID, err)
	}
	return b, nil
}
