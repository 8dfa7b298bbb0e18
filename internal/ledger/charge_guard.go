package ledger

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// anomalyHistory and anomalyHistoryMin: the anomaly guard compares a charge
// with the median of the customer's last anomalyHistory succeeded charges,
// and needs at least anomalyHistoryMin of them.
const (
	anomalyHistory    = 6
	anomalyHistoryMin = 3
)

// guardVerdict is what the guards say of a charge about to call Stripe for
// the first time: go on (the zero verdict), carry it forward, or hold it.
type guardVerdict struct {
	carry  bool       // below Stripe's minimum: settle it carried_forward
	hold   HeldReason // the reason to hold it with
	detail string     // why, in words
}

// chargeGuardsTx checks the guards of a charge that is about to call Stripe
// for the first time (not yet counted in its period's spend), in the claim's
// transaction: Stripe's own limits (below the currency's minimum: carried
// forward; above the maximum: held amount_too_large, even when approved),
// the customer's max_charge_cents, the anomaly guard and the period budget.
// When the verdict is to go on, the caller reserves the charge's amount
// (budget_reserved) in the same transaction, under the budget's lock when a
// budget is set. An approved charge skips the cap, anomaly and budget guards
// (the operator's decision) but is counted.
func (l *Ledger) chargeGuardsTx(ctx context.Context, tx pgx.Tx, c *Charge) (guardVerdict, error) {
	if min := AmountMinCents(c.Currency); c.AmountCents < min {
		return guardVerdict{carry: true, detail: fmt.Sprintf("amount %d is below Stripe's minimum of %d %s: carried to the customer's next charge",
			c.AmountCents, min, c.Currency)}, nil
	}
	if c.AmountCents > AmountMaxCents {
		return guardVerdict{hold: HeldAmountTooLarge, detail: fmt.Sprintf("amount %d %s is above Stripe's largest PaymentIntent, %d", c.AmountCents, c.Currency, AmountMaxCents)}, nil
	}
	if c.ApprovedAt == nil {
		// The customer's history is read with the cap, in its round trip.
		f := l.config.AnomalyFactor
		var history []int64
		if f > 0 {
			if err := chargeHistoryTx(ctx, tx, c, &history); err != nil {
				return guardVerdict{}, err
			}
		}
		var maxCharge *int64
		if err := tx.QueryRow(ctx, `SELECT max_charge_cents FROM billing.customers WHERE customer_id = $1`,
			c.CustomerID).Scan(&maxCharge); err != nil {
			return guardVerdict{}, fmt.Errorf("error reading customer cap: %w", err)
		}
		if maxCharge != nil && c.AmountCents > *maxCharge {
			return guardVerdict{hold: HeldOverCustomerCap, detail: fmt.Sprintf("amount %d exceeds the customer's max_charge_cents %d", c.AmountCents, *maxCharge)}, nil
		}
		if f > 0 {
			median, n := medianOf(history)
			if n >= anomalyHistoryMin && float64(c.AmountCents) > f*float64(median) {
				return guardVerdict{hold: HeldAnomaly, detail: fmt.Sprintf("amount %d is more than %g × %d, the median of the customer's last %d succeeded charges",
					c.AmountCents, f, median, n)}, nil
			}
		}
	}
	if b := l.config.PeriodBudgetCents; b > 0 {
		// An approved charge takes its turn too: it is counted, so a check
		// running beside it must see it.
		reserved, err := periodSpendLockTx(ctx, tx, c.Period, c.Currency)
		if err != nil {
			return guardVerdict{}, err
		}
		if c.ApprovedAt == nil && reserved+c.AmountCents > b {
			return guardVerdict{hold: HeldOverPeriodBudget, detail: fmt.Sprintf("amount %d would bring %s spend in %s to %d, over the budget of %d",
				c.AmountCents, c.Period, c.Currency, reserved+c.AmountCents, b)}, nil
		}
	}
	return guardVerdict{}, nil
}

// chargeHistorySQL reads a customer's last succeeded charges, but one, from
// charges_customer_succeeded_idx.
const chargeHistorySQL = `
SELECT amount_cents FROM billing.charges
WHERE customer_id = $1 AND status = 'succeeded' AND id <> $2
ORDER BY period_starts_at DESC, id DESC LIMIT $3`

// chargeHistoryTx reads into *amounts the amounts of the customer's last
// anomalyHistory succeeded charges before c, with tx's next statement
// (laterRows).
func chargeHistoryTx(ctx context.Context, tx pgx.Tx, c *Charge, amounts *[]int64) error {
	*amounts = nil
	err := laterRows(ctx, tx, func(rows pgx.Rows) error {
		var err error
		*amounts, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("error reading the customer's charges: %w", err)
		}
		return nil
	}, chargeHistorySQL, c.CustomerID, c.ID, anomalyHistory)
	if err != nil {
		return fmt.Errorf("error reading the customer's charges: %w", err)
	}
	return nil
}

// medianOf returns the median of amounts and how many there are.
func medianOf(amounts []int64) (int64, int) {
	n := len(amounts)
	if n == 0 {
		return 0, 0
	}
	sorted := slices.Clone(amounts)
	slices.Sort(sorted)
	if n%2 == 1 {
		return sorted[n/2], n
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2, n
}
