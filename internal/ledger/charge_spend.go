package ledger

import (
	"context"
	"errors"
	"fmt"

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
// changed status: a failed, uncollectible or canceled charge releases its
// reservation (a past_due one keeps it: it may still be collected); a
// succeeded one that had none (a late success, a resolve) takes it, whatever
// the budget, since the money moved. It returns the charge as stored.
func chargeSpendTx(ctx context.Context, tx *Tx, c *Charge) (*Charge, error) {
	switch {
	case c.BudgetReserved && (c.Status == ChargeFailed || c.Status == ChargeCanceled || c.Status == ChargeUncollectible):
		return chargeSpendSetTx(ctx, tx, c, false)
	case !c.BudgetReserved && c.Status == ChargeSucceeded:
		return chargeSpendSetTx(ctx, tx, c, true)
	}
	return c, nil
}

// chargeSpendSetTx reserves (reserve) or releases c's amount in its period's
// spend by marking the charge.
func chargeSpendSetTx(ctx context.Context, tx *Tx, c *Charge, reserve bool) (*Charge, error) {
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
func periodSpendLockTx(ctx context.Context, tx *Tx, period, currency string) (int64, error) {
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
