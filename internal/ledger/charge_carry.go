package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A charge below Stripe's minimum for its currency is not sent: its claim
// settles it carried_forward (chargeCarryForwardTx), and the customer's next
// charge in that currency bills it (chargeCarriedInTx, chargeCarriedIntoTx).

// chargeCarryForwardTx settles a pending charge below Stripe's minimum as
// carried_forward: no Stripe call; the customer's next charge bills it
// (chargeCarriedInTx).
func chargeCarryForwardTx(ctx context.Context, tx *Tx, now time.Time, c *Charge, actor, reason string) (*Charge, error) {
	carried, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET status = 'carried_forward', updated_at = $2 WHERE id = $1 RETURNING `+chargeColumns, c.ID, now))
	if err != nil {
		return nil, fmt.Errorf("error carrying charge %d forward: %w", c.ID, err)
	}
	if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, carried.Status, actor, reason); err != nil {
		return nil, err
	}
	return carried, nil
}

// carriedIn are the charges carried forward that a new charge takes in.
type carriedIn struct {
	ids   []int64
	total int64
}

// chargeCarriedInTx takes into a new charge of customerID in currency every
// earlier charge of theirs carried forward and not yet billed: it locks them,
// and returns their ids and total, for the new charge to add. The caller sets
// their carried_into (chargeCarriedIntoTx) once the new charge exists. The
// statement is sent with the transaction's next one.
func chargeCarriedInTx(tx *Tx, customerID, currency string) *later[carriedIn] {
	return queryLater(tx, func(rows pgx.Rows) (carriedIn, error) {
		var in carriedIn
		var id, amount int64
		_, err := pgx.ForEachRow(rows, []any{&id, &amount}, func() error {
			in.ids, in.total = append(in.ids, id), in.total+amount
			return nil
		})
		if err != nil {
			return carriedIn{}, fmt.Errorf("error finding carried charges: %w", err)
		}
		return in, nil
	}, `
SELECT id, amount_cents FROM billing.charges
WHERE customer_id = $1 AND currency = $2 AND status = 'carried_forward' AND carried_into IS NULL
ORDER BY id FOR UPDATE`, customerID, currency)
}

// chargeCarriedIntoTx records that charge into of customerID bills the
// carried charges ids (the customer's), with a transition (status
// unchanged) on each.
func chargeCarriedIntoTx(ctx context.Context, tx *Tx, now time.Time, ids []int64, into int64, customerID, actor string) error {
	for _, id := range ids {
		if _, err := tx.Exec(ctx, `UPDATE billing.charges SET carried_into = $2, updated_at = $3 WHERE id = $1`, id, into, now); err != nil {
			return fmt.Errorf("error carrying charge %d into %d: %w", id, into, err)
		}
		status := ChargeCarriedForward
		if err := transitionTx(ctx, tx, now, id, customerID, &status, status, actor, fmt.Sprintf("carried into charge %d", into)); err != nil {
			return err
		}
	}
	return nil
}
