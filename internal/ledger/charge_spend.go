package ledger

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// The per-period budget (TALLY_PERIOD_BUDGET_CENTS): per period label and
// currency, the view billing.period_spend sums the amounts of the charges in
// flight plus those that succeeded (budget_reserved). A charge reserves its
// amount in the claim that first lets it call Stripe (chargeGuardsTx) and
// releases it when it fails or is canceled; a success keeps it. The spend is
// derived from the charges rather than kept in a shared row, so charges of
// one period never queue behind each other's row lock; only when a budget is
// set do reservations of a (period, currency) take turns, under a
// transaction-level advisory lock (periodSpendLockTx).

// chargeSpendTx keeps the period's spend in step with a charge that just
// changed status: a failed or canceled charge releases its reservation; a
// succeeded one that had none (a late success, a resolve) takes it, whatever
// the budget, since the money moved. It returns the charge as stored.
func chargeSpendTx(ctx context.Context, tx pgx.Tx, c *Charge) (*Charge, error) {
	switch {
	case c.BudgetReserved && (c.Status == ChargeFailed || c.Status == ChargeCanceled):
		return chargeSpendSetTx(ctx, tx, c, false)
	case !c.BudgetReserved && c.Status == ChargeSucceeded:
		return chargeSpendSetTx(ctx, tx, c, true)
	}
	return c, nil
}

// chargeSpendSetTx reserves (reserve) or releases c's amount in its period's
// spend by marking the charge.
func chargeSpendSetTx(ctx context.Context, tx pgx.Tx, c *Charge, reserve bool) (*Charge, error) {
	updated, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET budget_reserved = $2 WHERE id = $1 RETURNING `+chargeColumns, c.ID, reserve))
	if err != nil {
		return nil, fmt.Errorf("error marking budget of charge %d: %w", c.ID, err)
	}
	return updated, nil
}

// periodSpendLockTx waits for the reservations of (period, currency) in
// other transactions to commit or roll back, holds them off until tx ends,
// and returns the period's spend: the check against the budget and the
// reservation that follows it are atomic.
func periodSpendLockTx(ctx context.Context, tx pgx.Tx, period, currency string) (int64, error) {
	// Two statements: the sum's snapshot must be taken after the lock is.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('tally.period_spend/' || $1 || '/' || $2, 0))`,
		period, currency); err != nil {
		return 0, fmt.Errorf("error locking spend of %s %s: %w", period, currency, err)
	}
	var reserved int64
	if err := tx.QueryRow(ctx, `
SELECT coalesce(sum(amount_cents), 0)::bigint FROM billing.charges
WHERE period = $1 AND currency = $2 AND budget_reserved`, period, currency).Scan(&reserved); err != nil {
		return 0, fmt.Errorf("error reading spend of %s %s: %w", period, currency, err)
	}
	return reserved, nil
}

// errCarryForward is chargeGuardsTx's answer for a total below Stripe's
// minimum: the claim settles the charge carried_forward instead.
var errCarryForward = errors.New("carry forward")

// chargeCarryForwardTx settles a pending charge below Stripe's minimum as
// carried_forward: no Stripe call; the customer's next charge bills it
// (chargeCarriedInTx).
func chargeCarryForwardTx(ctx context.Context, tx pgx.Tx, now time.Time, c *Charge, actor, reason string) (*Charge, error) {
	carried, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET status = 'carried_forward', updated_at = $2 WHERE id = $1 RETURNING `+chargeColumns, c.ID, now))
	if err != nil {
		return nil, fmt.Errorf("error carrying charge %d forward: %w", c.ID, err)
	}
	return carried, transitionTx(ctx, tx, now, c.ID, &c.Status, carried.Status, actor, reason)
}

// chargeCarriedInTx takes into a new charge of customerID in currency every
// earlier charge of theirs carried forward and not yet billed: it locks them,
// and returns their ids and total, for the new charge to add. The caller sets
// their carried_into (chargeCarriedIntoTx) once the new charge exists.
func chargeCarriedInTx(ctx context.Context, tx pgx.Tx, customerID, currency string) ([]int64, int64, error) {
	rows, err := tx.Query(ctx, `
SELECT id, amount_cents FROM billing.charges
WHERE customer_id = $1 AND currency = $2 AND status = 'carried_forward' AND carried_into IS NULL
ORDER BY id FOR UPDATE`, customerID, currency)
	if err != nil {
		return nil, 0, fmt.Errorf("error finding carried charges: %w", err)
	}
	var ids []int64
	var total int64
	for rows.Next() {
		var id, amount int64
		if err := rows.Scan(&id, &amount); err != nil {
			return nil, 0, err
		}
		ids, total = append(ids, id), total+amount
	}
	return ids, total, rows.Err()
}

// chargeCarriedIntoTx records that charge into bills the carried charges ids,
// with a transition (status unchanged) on each.
func chargeCarriedIntoTx(ctx context.Context, tx pgx.Tx, now time.Time, ids []int64, into int64, actor string) error {
	for _, id := range ids {
		if _, err := tx.Exec(ctx, `UPDATE billing.charges SET carried_into = $2, updated_at = $3 WHERE id = $1`, id, into, now); err != nil {
			return fmt.Errorf("error carrying charge %d into %d: %w", id, into, err)
		}
		status := ChargeCarriedForward
		if err := transitionTx(ctx, tx, now, id, &status, status, actor, fmt.Sprintf("carried into charge %d", into)); err != nil {
			return err
		}
	}
	return nil
}

// anomalyHistory and anomalyHistoryMin: the anomaly guard compares a charge
// with the median of the customer's last anomalyHistory succeeded charges,
// and needs at least anomalyHistoryMin of them.
const (
	anomalyHistory    = 6
	anomalyHistoryMin = 3
)

// chargeGuardsTx checks the guards of a charge that is about to call Stripe
// for the first time (not yet counted in its period's spend), in the claim's
// transaction: Stripe's own limits (below the currency's minimum: carried
// forward, returned as errCarryForward; above the maximum: held
// amount_too_large, even when approved), the customer's max_charge_cents, the
// anomaly guard and the period budget. It returns the reason to hold the
// charge with and its detail, or "" when the charge may go on: the caller
// then reserves its amount (budget_reserved) in the same transaction, under
// the budget's lock when a budget is set. An approved charge skips the cap,
// anomaly and budget guards (the operator's decision) but is counted.
func (l *Ledger) chargeGuardsTx(ctx context.Context, tx pgx.Tx, c *Charge) (HeldReason, string, error) {
	if min := AmountMinCents(c.Currency); c.AmountCents < min {
		return "", fmt.Sprintf("amount %d is below Stripe's minimum of %d %s: carried to the customer's next charge",
			c.AmountCents, min, c.Currency), errCarryForward
	}
	if c.AmountCents > AmountMaxCents {
		return HeldAmountTooLarge, fmt.Sprintf("amount %d %s is above Stripe's largest PaymentIntent, %d", c.AmountCents, c.Currency, AmountMaxCents), nil
	}
	if c.ApprovedAt == nil {
		var maxCharge *int64
		if err := tx.QueryRow(ctx, `SELECT max_charge_cents FROM billing.customers WHERE customer_id = $1`,
			c.CustomerID).Scan(&maxCharge); err != nil {
			return "", "", fmt.Errorf("error reading customer cap: %w", err)
		}
		if maxCharge != nil && c.AmountCents > *maxCharge {
			return HeldOverCustomerCap, fmt.Sprintf("amount %d exceeds the customer's max_charge_cents %d", c.AmountCents, *maxCharge), nil
		}
		if f := l.config.AnomalyFactor; f > 0 {
			median, n, err := chargeMedianTx(ctx, tx, c)
			if err != nil {
				return "", "", err
			}
			if n >= anomalyHistoryMin && float64(c.AmountCents) > f*float64(median) {
				return HeldAnomaly, fmt.Sprintf("amount %d is more than %g × %d, the median of the customer's last %d succeeded charges",
					c.AmountCents, f, median, n), nil
			}
		}
	}
	if b := l.config.PeriodBudgetCents; b > 0 {
		// An approved charge takes its turn too: it is counted, so a check
		// running beside it must see it.
		reserved, err := periodSpendLockTx(ctx, tx, c.Period, c.Currency)
		if err != nil {
			return "", "", err
		}
		if c.ApprovedAt == nil && reserved+c.AmountCents > b {
			return HeldOverPeriodBudget, fmt.Sprintf("amount %d would bring %s spend in %s to %d, over the budget of %d",
				c.AmountCents, c.Period, c.Currency, reserved+c.AmountCents, b), nil
		}
	}
	return "", "", nil
}

// chargeHistorySQL reads a customer's last succeeded charges, but one, from
// charges_customer_succeeded_idx.
const chargeHistorySQL = `
SELECT amount_cents FROM billing.charges
WHERE customer_id = $1 AND status = 'succeeded' AND id <> $2
ORDER BY period_starts_at DESC, id DESC LIMIT $3`

// chargeMedianTx returns the median amount of the customer's last
// anomalyHistory succeeded charges before c, and how many there were.
func chargeMedianTx(ctx context.Context, tx pgx.Tx, c *Charge) (int64, int, error) {
	rows, err := tx.Query(ctx, chargeHistorySQL, c.CustomerID, c.ID, anomalyHistory)
	if err != nil {
		return 0, 0, fmt.Errorf("error reading the customer's charges: %w", err)
	}
	amounts, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(amounts) == 0 {
		return 0, 0, err
	}
	sort.Slice(amounts, func(i, j int) bool { return amounts[i] < amounts[j] })
	n := len(amounts)
	if n%2 == 1 {
		return amounts[n/2], n, nil
	}
	return (amounts[n/2-1] + amounts[n/2]) / 2, n, nil
}

// PeriodSpend is what a period's charges reserve in one currency.
type PeriodSpend struct {
	Period        string
	Currency      string
	ReservedCents int64
}

// PeriodSpendGet returns the spend of period in currency (zero when nothing
// was reserved).
func (l *Ledger) PeriodSpendGet(ctx context.Context, period, currency string) (*PeriodSpend, error) {
	s := &PeriodSpend{Period: period, Currency: currency}
	err := l.pool.QueryRow(ctx, `SELECT reserved_cents FROM billing.period_spend WHERE period = $1 AND currency = $2`,
		period, currency).Scan(&s.ReservedCents)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("error reading spend of %s %s: %w", period, currency, err)
	}
	return s, nil
}
