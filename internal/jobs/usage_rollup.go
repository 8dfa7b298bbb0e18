package jobs

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/tally-billing/tally/internal/ledger"
)

// UsageRollupIntervalDefault is how often the usage roll-up runs. The
// roll-ups, and the usage thresholds they check, lag ingest by about two
// runs (ledger.UsageRollup waits for the transactions in flight at one run
// to end before the next adds their events).
const UsageRollupIntervalDefault = 2 * time.Second

// usageRollupRunsMax bounds the roll-ups one job runs back to back while a
// backlog remains (ledger.UsageRollupBatchMax event ids each).
const usageRollupRunsMax = 50

// UsageRollupArgs are the args of the usage roll-up, a periodic job.
type UsageRollupArgs struct{}

// Kind is the River job kind, "usage_rollup".
func (UsageRollupArgs) Kind() string { return "usage_rollup" }

// InsertOpts puts the job on QueueMaintenance, at most one a second.
func (UsageRollupArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance, UniqueOpts: river.UniqueOpts{ByPeriod: time.Second}}
}

// UsageRollupWorker adds the events and voids committed since its last run
// to the usage roll-ups, and records the usage thresholds their rated
// totals reached, each with its usage.threshold_reached notification
// (ledger.UsageRollup).
type UsageRollupWorker struct {
	river.WorkerDefaults[UsageRollupArgs]

	ledger *ledger.Ledger
	logger *slog.Logger
}

// Work runs roll-ups until no backlog remains, or usageRollupRunsMax ran.
func (w *UsageRollupWorker) Work(ctx context.Context, _ *river.Job[UsageRollupArgs]) error {
	for range usageRollupRunsMax {
		res, err := w.ledger.UsageRollup(ctx)
		if err != nil {
			return err
		}
		if res.Thresholds > 0 {
			w.logger.InfoContext(ctx, "usage thresholds reached", slog.Int("thresholds", res.Thresholds))
		}
		if !res.More {
			return nil
		}
	}
	return nil
}
