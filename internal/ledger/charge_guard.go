package ledger

import (
	"context"
	"errors"
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
func (l *Ledger) chargeGuardsTx(ctx context.Context, tx *Tx, c *Charge, reads *guardReads) (guardVerdict, error) {
	if min := AmountMinCents(c.Currency); c.AmountCents < min {
		return guardVerdict{carry: true, detail: fmt.Sprintf("amount %d is below Stripe's minimum of %d %s: carried to the customer's next charge",
			c.AmountCents, min, c.Currency)}, nil
	}
	if c.AmountCents > AmountMaxCents {
		return guardVerdict{hold: HeldAmountTooLarge, detail: fmt.Sprintf("amount %d %s is above Stripe's largest PaymentIntent, %d", c.AmountCents, c.Currency, AmountMaxCents)}, nil
	}
	if c.ApprovedAt == nil {
		if reads == nil {
			return guardVerdict{}, errors.New("the guards' reads were not queued")
		}
		m, err := reads.maxCharge.get(ctx)
		if err != nil {
			return guardVerdict{}, err
		}
		if m != nil && c.AmountCents > *m {
			return guardVerdict{hold: HeldOverCustomerCap, detail: fmt.Sprintf("amount %d exceeds the customer's max_charge_cents %d", c.AmountCents, *m)}, nil
		}
		if f := l.config.AnomalyFactor; f > 0 {
			history, err := reads.history.get(ctx)
			if err != nil {
				return guardVerdict{}, err
			}
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

// guardReads are what the cap and anomaly guards read of a charge's
// customer: their max_charge_cents and, when the anomaly guard is on, their
// last succeeded charges. They are queued (chargeGuardReadsTx) to go with
// the claim's next statement, the kill switch's read, in its round trip.
type guardReads struct {
	maxCharge *later[*int64]
	history   *later[[]int64] // nil when the anomaly guard is off
}

// chargeGuardReadsTx queues in tx the reads chargeGuardsTx will need for
// charge c, nil when it needs none (an approved charge, or one Stripe's
// limits settle).
func (l *Ledger) chargeGuardReadsTx(tx *Tx, c *Charge) *guardReads {
	if c.ApprovedAt != nil || c.AmountCents < AmountMinCents(c.Currency) || c.AmountCents > AmountMaxCents {
		return nil
	}
	r := &guardReads{}
	if l.config.AnomalyFactor > 0 {
		r.history = queryLater(tx, func(rows pgx.Rows) ([]int64, error) {
			history, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return nil, fmt.Errorf("error reading the customer's charges: %w", err)
			}
			return history, nil
		}, chargeHistorySQL, c.CustomerID, c.ID, anomalyHistory)
	}
	r.maxCharge = queryRowLater(tx, func(row pgx.Row) (*int64, error) {
		var m *int64
		if err := row.Scan(&m); err != nil {
			return nil, fmt.Errorf("error reading customer cap: %w", err)
		}
		return m, nil
	}, `SELECT max_charge_cents FROM billing.customers WHERE customer_id = $1`, c.CustomerID)
	return r
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
