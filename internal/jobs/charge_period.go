package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// QueueCharges is the queue of charge_period jobs. Pausing it is the kill
// switch for money movement.
const QueueCharges = "charges"

// ChargePeriodArgs are the args of the charge job of one (customer, period).
// The job is unique by both fields: River refuses a second live job for the
// same pair, a second guard behind the period row that inserts it only once.
type ChargePeriodArgs struct {
	CustomerID string `json:"customer_id" river:"unique"`
	Period     string `json:"period" river:"unique"`
}

// Kind is the River job kind, "charge_period".
func (ChargePeriodArgs) Kind() string { return "charge_period" }

// InsertOpts puts charge jobs on QueueCharges, unique by args.
func (ChargePeriodArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:      QueueCharges,
		UniqueOpts: river.UniqueOpts{ByArgs: true},
	}
}

// ChargeScheduler implements ledger.ChargeScheduler with a River client,
// which may be insert-only.
type ChargeScheduler struct {
	Client *river.Client[pgx.Tx]
}

// ChargeJobInsertTx inserts the charge_period job for (customerID, period) in
// tx, scheduled at runAt, and returns its id — the existing job's id when
// River's unique constraint finds one.
func (s ChargeScheduler) ChargeJobInsertTx(ctx context.Context, tx pgx.Tx, customerID, period string, runAt time.Time) (int64, error) {
	res, err := s.Client.InsertTx(ctx, tx, ChargePeriodArgs{CustomerID: customerID, Period: period},
		&river.InsertOpts{ScheduledAt: runAt})
	if err != nil {
		return 0, fmt.Errorf("error inserting charge job %s/%s: %w", customerID, period, err)
	}
	return res.Job.ID, nil
}

// ChargeJobRunNowTx makes the job available at once in tx (River's
// JobRetryTx); a running job is left alone, a finished one runs again and
// finds its charge settled.
func (s ChargeScheduler) ChargeJobRunNowTx(ctx context.Context, tx pgx.Tx, jobID int64) error {
	if _, err := s.Client.JobRetryTx(ctx, tx, jobID); err != nil {
		return fmt.Errorf("error making charge job %d run now: %w", jobID, err)
	}
	return nil
}
