package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ChargeJobRunNow makes the charge job of a charge's period run now (River
// JobRetry: available at once; a discarded job is revived, a running one left
// alone, a deleted one inserted again). The job finds the charge's state and
// does only what is left.
func (l *Ledger) ChargeJobRunNow(ctx context.Context, chargeID int64) error {
	return l.withTx(ctx, func(tx *Tx) error {
		var customerID, period string
		var jobID *int64
		err := tx.QueryRow(ctx, `
SELECT c.customer_id, c.period, p.charge_job_id FROM billing.charges c
JOIN billing.periods p ON p.customer_id = c.customer_id AND p.period = c.period
WHERE c.id = $1
FOR UPDATE OF p`, chargeID).Scan(&customerID, &period, &jobID)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("charge %d", chargeID)
		}
		if err != nil {
			return fmt.Errorf("error finding charge job of charge %d: %w", chargeID, err)
		}
		return l.chargeJobRunNowTx(ctx, tx, customerID, period, jobID)
	})
}

// chargePeriodJobRunNowTx makes the charge job of c's period run now, in
// tx, holding the period row until tx ends (an operator's approval or
// retry of c).
func (l *Ledger) chargePeriodJobRunNowTx(ctx context.Context, tx *Tx, c *Charge) error {
	var jobID *int64
	if err := tx.QueryRow(ctx, `SELECT charge_job_id FROM billing.periods WHERE customer_id = $1 AND period = $2 FOR UPDATE`,
		c.CustomerID, c.Period).Scan(&jobID); err != nil {
		return fmt.Errorf("error finding charge job: %w", err)
	}
	return l.chargeJobRunNowTx(ctx, tx, c.CustomerID, c.Period, jobID)
}

// chargeJobRunNowTx makes the period's charge job run now and records its id
// when it changed. The caller holds the period row.
func (l *Ledger) chargeJobRunNowTx(ctx context.Context, tx *Tx, customerID, period string, jobID *int64) error {
	var old int64
	if jobID != nil {
		old = *jobID
	}
	id, err := l.config.Scheduler.ChargeJobRunNowTx(ctx, tx, old, customerID, period)
	if err != nil {
		return err
	}
	if id != old {
		if _, err := tx.Exec(ctx, `UPDATE billing.periods SET charge_job_id = $3 WHERE customer_id = $1 AND period = $2`,
			customerID, period, id); err != nil {
			return fmt.Errorf("error recording charge job of %s/%s: %w", customerID, period, err)
		}
	}
	return nil
}
