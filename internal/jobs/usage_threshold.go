package jobs

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/tally-billing/tally/internal/ledger"
)

// UsageThresholdIntervalDefault is how often the usage threshold scan runs:
// a threshold crossed is told within about this much of the event.
const UsageThresholdIntervalDefault = 20 * time.Second

// UsageThresholdScanArgs are the args of the usage threshold scan, a
// periodic job.
type UsageThresholdScanArgs struct{}

// Kind is the River job kind, "usage_threshold_scan".
func (UsageThresholdScanArgs) Kind() string { return "usage_threshold_scan" }

// InsertOpts puts the job on QueueMaintenance, at most one a period.
func (UsageThresholdScanArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance, UniqueOpts: river.UniqueOpts{ByPeriod: 10 * time.Second}}
}

// UsageThresholdScanWorker records the usage thresholds crossed since its
// last run, each with its usage.threshold_reached notification
// (ledger.UsageThresholdScan).
type UsageThresholdScanWorker struct {
	river.WorkerDefaults[UsageThresholdScanArgs]

	ledger *ledger.Ledger
	logger *slog.Logger
}

// Work runs one scan.
func (w *UsageThresholdScanWorker) Work(ctx context.Context, _ *river.Job[UsageThresholdScanArgs]) error {
	n, err := w.ledger.UsageThresholdScan(ctx, ledger.UsageThresholdSettleDefault)
	if err != nil {
		return err
	}
	if n > 0 {
		w.logger.InfoContext(ctx, "usage thresholds reached", slog.Int("thresholds", n))
	}
	return nil
}
