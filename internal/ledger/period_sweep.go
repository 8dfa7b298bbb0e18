package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// PeriodJobLost is a period found still open well past its close whose
// charge job the queue will not run, with what the sweep did about it.
type PeriodJobLost struct {
	CustomerID string
	Period     string
	ClosesAt   time.Time

	// JobID is the charge job the period recorded (nil: none), and JobState
	// its state when the sweep found it: completed, cancelled, discarded,
	// JobStateDeleted or JobStateNone.
	JobID    *int64
	JobState string

	// NewJobID is the charge job that runs now: JobID made available again,
	// or a new job when the queue no longer had it. Zero when Err is set.
	NewJobID int64

	// Err says why the job could not be run again; nothing was changed for
	// this period, and the next sweep tries again.
	Err error
}

// PeriodSweepParams are the fields of PeriodSweepLostJobs.
type PeriodSweepParams struct {
	// ClosesBefore bounds the periods looked at: only those whose closes_at
	// is before it. The sweep passes now minus its grace, so a job that is
	// only a little late is left alone.
	ClosesBefore time.Time

	// Jobs reads the state of the periods' charge jobs. Required.
	Jobs SweepJobs
}

// PeriodSweepLostJobs finds every period still open although it closed
// before p.ClosesBefore whose charge job the queue will not run — discarded
// after its retries, cancelled, completed, deleted by River's retention, or
// never recorded — and makes its charge job run now, in the transaction that
// found it: River's JobRetry of the recorded job, or a new job when River no
// longer has it, recorded on the period (ChargeJobRunNow's machinery). The
// job then closes the period and charges it as usual.
//
// Periods whose job is live (scheduled, available, running, retryable — late,
// or waiting behind a paused charge queue) are left alone, and so are periods
// locked by a close at that moment. It works in pages of sweepPageSize
// periods, one committed transaction each, and returns every lost job it
// found; one whose job could not be run again is returned with Err, and the
// sweep goes on with the others.
func (l *Ledger) PeriodSweepLostJobs(ctx context.Context, p PeriodSweepParams) ([]PeriodJobLost, error) {
	if p.Jobs == nil {
		return nil, errors.New("error sweeping periods: PeriodSweepParams.Jobs is required")
	}
	var all []PeriodJobLost
	var cursor *overduePeriod
	for {
		var page []overduePeriod
		var found []PeriodJobLost
		err := l.withTx(ctx, func(tx *Tx) error {
			found = nil
			var err error
			if page, err = overduePeriodsTx(ctx, tx, p.ClosesBefore, cursor); err != nil {
				return err
			}
			ids := make([]*int64, len(page))
			for i := range page {
				ids[i] = page[i].jobID
			}
			states, err := p.Jobs.JobStatesTx(ctx, tx, jobIDs(ids))
			if err != nil {
				return fmt.Errorf("error reading charge jobs: %w", err)
			}
			for _, op := range page {
				state := jobStateOf(op.jobID, states)
				if jobLive(state) {
					continue
				}
				lost := PeriodJobLost{CustomerID: op.customerID, Period: op.period, ClosesAt: op.closesAt, JobID: op.jobID, JobState: state}
				lost.NewJobID, lost.Err = l.periodJobRerunTx(ctx, tx, op)
				found = append(found, lost)
			}
			return nil
		})
		if err != nil {
			return all, fmt.Errorf("error sweeping periods past their close: %w", err)
		}
		all = append(all, found...)
		if len(page) < sweepPageSize || ctx.Err() != nil {
			return all, nil
		}
		cursor = &page[len(page)-1]
	}
}

// overduePeriod is a row of overduePeriodsTx.
type overduePeriod struct {
	customerID string
	period     string
	closesAt   time.Time
	jobID      *int64
}

// overduePeriodsTx returns the next page of open periods that closed before
// closesBefore, after cursor (nil: from the start), locked FOR NO KEY UPDATE
// (ingest's FOR KEY SHARE goes on; a close's FOR UPDATE waits, and a period
// being closed now is skipped).
func overduePeriodsTx(ctx context.Context, tx *Tx, closesBefore time.Time, cursor *overduePeriod) ([]overduePeriod, error) {
	var c overduePeriod
	if cursor != nil {
		c = *cursor
	}
	rows, err := tx.Query(ctx, `
SELECT customer_id, period, closes_at, charge_job_id FROM billing.periods
WHERE status = 'open' AND closes_at < $1
  AND ($2 OR (closes_at, customer_id, period) > ($3, $4, $5))
ORDER BY closes_at, customer_id, period
LIMIT $6
FOR NO KEY UPDATE SKIP LOCKED`, closesBefore, cursor == nil, c.closesAt, c.customerID, c.period, sweepPageSize)
	if err != nil {
		return nil, fmt.Errorf("error listing periods past their close: %w", err)
	}
	page, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (overduePeriod, error) {
		var op overduePeriod
		if err := r.Scan(&op.customerID, &op.period, &op.closesAt, &op.jobID); err != nil {
			return overduePeriod{}, err
		}
		return op, nil
	})
	if err != nil {
		return nil, fmt.Errorf("error listing periods past their close: %w", err)
	}
	return page, nil
}

// periodJobRerunTx makes the charge job of a period the caller holds run now,
// in a savepoint so that a failure leaves the rest of the page alone, and
// returns the id of the job that runs.
func (l *Ledger) periodJobRerunTx(ctx context.Context, tx *Tx, op overduePeriod) (int64, error) {
	var jobID int64
	err := tx.savepoint(ctx, func(sp *Tx) error {
		if err := l.chargeJobRunNowTx(ctx, sp, op.customerID, op.period, op.jobID); err != nil {
			return err
		}
		return sp.QueryRow(ctx, `SELECT charge_job_id FROM billing.periods WHERE customer_id = $1 AND period = $2`,
			op.customerID, op.period).Scan(&jobID)
	})
	if err != nil {
		return 0, fmt.Errorf("error running charge job of period %s/%s again: %w", op.customerID, op.period, err)
	}
	return jobID, nil
}
