package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// PeriodCloseParams are the fields of PeriodClose.
type PeriodCloseParams struct {
	CustomerID string
	Period     string

	// Actor is who closes: job:<id>/<attempt> or operator:<key prefix>.
	Actor string

	// RunChargeJobNow makes the period's charge job available at once (in the
	// same transaction), for an explicit close before the scheduled time.
	RunChargeJobNow bool
}

// PeriodClose closes a period and returns its charge: step 1 of the money
// path ("close + pre-flight"), in one transaction. It locks the period FOR
// UPDATE, so it waits for in-flight ingests holding FOR KEY SHARE and every
// later ingest sees the period closed; marks it closed; and, unless the
// charge exists already (then it is returned unchanged), sums the period's
// events and creates the charge: skipped for a zero total, pending otherwise
// (the guards hold it, if need be, before its first call: ChargeClaim). The charge snapshots
// the Stripe customer, payment method, amount and currency.
//
// It returns ErrNotFound when the period does not exist.
func (l *Ledger) PeriodClose(ctx context.Context, p PeriodCloseParams) (*Charge, error) {
	if !validID(p.CustomerID) || !validID(p.Period) {
		return nil, notFound("period %s of customer %q", p.Period, p.CustomerID)
	}
	var charge *Charge
	err := l.withTx(ctx, func(tx pgx.Tx) error {
		now := l.now()
		var status string
		var jobID *int64
		err := tx.QueryRow(ctx, `
SELECT status, charge_job_id FROM billing.periods
WHERE customer_id = $1 AND period = $2
FOR UPDATE`, p.CustomerID, p.Period).Scan(&status, &jobID)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("period %s of customer %q", p.Period, p.CustomerID)
		}
		if err != nil {
			return fmt.Errorf("error locking period: %w", err)
		}
		if status == PeriodOpen {
			if _, err := tx.Exec(ctx, `
UPDATE billing.periods SET status = 'closed', closed_at = $3
WHERE customer_id = $1 AND period = $2`, p.CustomerID, p.Period, now); err != nil {
				return fmt.Errorf("error closing period: %w", err)
			}
		}
		if p.RunChargeJobNow {
			if err := l.chargeJobRunNowTx(ctx, tx, p.CustomerID, p.Period, jobID); err != nil {
				return err
			}
		}

		charge, err = chargeGetTx(ctx, tx, p.CustomerID, p.Period)
		if err == nil {
			return nil
		}
		if !isNotFound(err) {
			return fmt.Errorf("error reading charge: %w", err)
		}
		charge, err = chargeCreateTx(ctx, tx, p, l.config.Namespace, now)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("error closing period %s/%s: %w", p.CustomerID, p.Period, err)
	}
	return charge, nil
}
