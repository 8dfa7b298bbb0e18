package jobs

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/tally-billing/tally/internal/ledger"
)

// DunningIntervalDefault is how often the dunning scan looks for past_due
// charges whose retry is due: a retry runs within about this much of its
// time.
const DunningIntervalDefault = time.Minute

// dunningScanLimit bounds the retries one scan starts.
const dunningScanLimit = 500

// DunningScanArgs are the args of the dunning scan, a periodic job.
type DunningScanArgs struct{}

// Kind is the River job kind, "dunning_scan".
func (DunningScanArgs) Kind() string { return "dunning_scan" }

// InsertOpts puts the job on QueueMaintenance, at most one a period.
func (DunningScanArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance, UniqueOpts: river.UniqueOpts{ByPeriod: time.Second}}
}

// DunningScanWorker makes the charge job of every past_due charge whose
// retry is due run now (ledger.ChargeRetriesDue); the job then retries the
// charge (ChargePeriodWorker's steps 3 and 4).
type DunningScanWorker struct {
	river.WorkerDefaults[DunningScanArgs]

	ledger *ledger.Ledger
	logger *slog.Logger
}

// Work runs one scan.
func (w *DunningScanWorker) Work(ctx context.Context, _ *river.Job[DunningScanArgs]) error {
	ids, err := w.ledger.ChargeRetriesDue(ctx, dunningScanLimit)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		w.logger.InfoContext(ctx, "past_due charges due for a retry", slog.Int("charges", len(ids)), slog.Any("charge_ids", ids))
	}
	return nil
}
