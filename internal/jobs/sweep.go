package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/tally-billing/tally/internal/ledger"
)

// Defaults of the sweep.
const (
	// SweepIntervalDefault is how often the sweep runs.
	SweepIntervalDefault = 5 * time.Minute

	// SweepAfterDefault is how long past its due time a period or a Stripe
	// event must be before the sweep treats a job that cannot run as lost:
	// a period still open this long after its closes_at, an event still
	// unprocessed this long after it was received. Shorter than a day, so a
	// lost job is found long before anyone would notice a missing charge.
	SweepAfterDefault = 15 * time.Minute

	// StripeEventStuckAttemptsDefault is how many failed processing attempts
	// make a Stripe event stuck (ALERT stripe_event_stuck). With River's
	// backoff the fifth attempt comes about 16 minutes after the first.
	StripeEventStuckAttemptsDefault = 5

	// StripeEventStuckAfterDefault is how long after its receipt an
	// unprocessed Stripe event is stuck, however few its attempts.
	StripeEventStuckAfterDefault = time.Hour
)

// sweepTimeout bounds one sweep run; what is left is taken up by the next.
const sweepTimeout = 10 * time.Minute

// SweepArgs are the args of the sweep, a periodic job.
type SweepArgs struct{}

// Kind is the River job kind, "sweep".
func (SweepArgs) Kind() string { return "sweep" }

// InsertOpts puts the job on QueueMaintenance, at most one waiting or
// running at a time.
func (SweepArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance, UniqueOpts: river.UniqueOpts{ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRetryable,
		rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}}}
}

// SweepWorker finds work that the queue lost, so nothing is lost without
// anyone noticing:
//
//   - a period still open after more than after past its closes_at whose
//     charge job will not run (discarded after its retries, cancelled,
//     deleted by River's retention): its charge job runs again, and it is
//     logged as ALERT period_job_lost (ledger.PeriodSweepLostJobs);
//   - a Stripe event still received or failed after more than after since
//     its receipt whose job will not run: its job runs again (logged);
//     an event that has failed stuckAttempts times or is older than
//     stuckAfter is logged as ALERT stripe_event_stuck, at most once an hour
//     (ledger.StripeEventSweep);
//   - a credit grant past its expires_at with something left that no open
//     period can still apply: what is left expires (ledger.CreditGrantsExpire);
//   - a top-up not settled (pending, unknown, processing) and not moved for
//     longer than stuckAfter: logged as ALERT top_up_stuck, and its job runs
//     now (ledger.TopUpsStuck).
//
// River runs periodic jobs on its leader only; the ledger locks what it
// sweeps, so a second run at once finds nothing to do.
type SweepWorker struct {
	river.WorkerDefaults[SweepArgs]

	ledger        *ledger.Ledger
	logger        *slog.Logger
	after         time.Duration
	stuckAttempts int
	stuckAfter    time.Duration
}

// Timeout bounds a run.
func (w *SweepWorker) Timeout(*river.Job[SweepArgs]) time.Duration { return sweepTimeout }

// Work runs both sweeps with the River client that works the job.
func (w *SweepWorker) Work(ctx context.Context, job *river.Job[SweepArgs]) error {
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return fmt.Errorf("error sweeping: %w", err)
	}
	return w.sweep(ctx, Scheduler{Client: client}, fmt.Sprintf("job:%d/%d", job.ID, job.Attempt))
}

// sweep runs the period sweep, the Stripe event sweep and the credit
// grants' expiry, and logs what they found. A failing sweep does not stop
// the others; the run fails so River retries it.
func (w *SweepWorker) sweep(ctx context.Context, jobs ledger.SweepJobs, actor string) error {
	now := w.ledger.Now()
	lost, periodErr := w.ledger.PeriodSweepLostJobs(ctx, ledger.PeriodSweepParams{ClosesBefore: now.Add(-w.after), Jobs: jobs})
	for _, p := range lost {
		w.logPeriodJobLost(ctx, now, p)
	}
	swept, eventErr := w.ledger.StripeEventSweep(ctx, ledger.StripeEventSweepParams{
		ReceivedBefore: now.Add(-w.after), StuckAttempts: w.stuckAttempts, StuckBefore: now.Add(-w.stuckAfter), Jobs: jobs,
	})
	for _, s := range swept {
		w.logStripeEventSwept(ctx, now, s)
	}
	expired, expiryErr := w.ledger.CreditGrantsExpire(ctx, actor)
	for _, e := range expired {
		w.logger.InfoContext(ctx, "credit grant expired", slog.String("customer_id", e.CustomerID),
			slog.String("grant_id", e.GrantID), slog.Int64("expired_cents", e.AmountCents), slog.String("currency", e.Currency),
			slog.Time("expires_at", e.ExpiresAt))
	}
	var stuck []*ledger.TopUp
	charging, topUpErr := w.ledger.ChargingGet(ctx)
	if topUpErr == nil && !charging.Paused {
		// Paused, top-ups wait for the kill switch, which alerts itself.
		stuck, topUpErr = w.ledger.TopUpsStuck(ctx, w.stuckAfter, 100)
	}
	for _, t := range stuck {
		err := w.ledger.TopUpJobRunNow(ctx, t.CustomerID, t.TopUpID)
		action := "job_run_again"
		if err != nil {
			action, topUpErr = "none; running its job again failed, the next sweep retries: "+err.Error(), errors.Join(topUpErr, err)
		}
		var failure string
		if t.FailureMessage != nil {
			failure = *t.FailureMessage
		}
		w.logger.ErrorContext(ctx, "ALERT top-up not settled long after its last move (docs/operations.md#alert-top_up_stuck)",
			ledger.AlertTopUpStuck.Attr(), slog.String("customer_id", t.CustomerID), slog.String("top_up_id", t.TopUpID),
			slog.String("status", string(t.Status)), slog.Int("attempts", t.AttemptCount), slog.String("last_error", failure),
			slog.String("since", now.Sub(t.UpdatedAt).Round(time.Second).String()), slog.String("action", action))
	}
	return errors.Join(periodErr, eventErr, expiryErr, topUpErr)
}

func (w *SweepWorker) logPeriodJobLost(ctx context.Context, now time.Time, p ledger.PeriodJobLost) {
	attrs := []any{
		ledger.AlertPeriodJobLost.Attr(), slog.String("customer_id", p.CustomerID), slog.String("period", p.Period),
		slog.Time("closes_at", p.ClosesAt), slog.String("overdue", now.Sub(p.ClosesAt).Round(time.Second).String()),
		slog.Any("job_id", p.JobID), slog.String("job_state", p.JobState),
	}
	if p.Err != nil {
		w.logger.ErrorContext(ctx, "ALERT period open past its close and its charge job is gone; running the job again failed, the next sweep retries",
			append(attrs, slog.String("action", "none"), slog.String("error", p.Err.Error()))...)
		return
	}
	w.logger.ErrorContext(ctx, "ALERT period open past its close and its charge job is gone; the charge job runs again",
		append(attrs, slog.String("action", "charge_job_run_now"), slog.Int64("new_job_id", p.NewJobID))...)
}

func (w *SweepWorker) logStripeEventSwept(ctx context.Context, now time.Time, s ledger.StripeEventSwept) {
	var lastError string
	if s.Event.LastError != nil {
		lastError = *s.Event.LastError
	}
	action := "none; its job is still retrying"
	switch {
	case s.Err != nil:
		action = "none; running its lost job again failed, the next sweep retries: " + s.Err.Error()
	case s.Requeued:
		action = "job_run_again"
	}
	attrs := []any{
		slog.String("event_id", s.Event.ID), slog.String("type", s.Event.Type), slog.String("status", s.Event.Status),
		slog.Int("attempts", s.Event.Attempts), slog.String("last_error", lastError),
		slog.Time("received_at", s.Event.ReceivedAt), slog.String("age", now.Sub(s.Event.ReceivedAt).Round(time.Second).String()),
		slog.Any("job_id", s.Event.JobID), slog.String("job_state", s.JobState), slog.String("action", action),
	}
	if s.Requeued {
		attrs = append(attrs, slog.Int64("new_job_id", s.NewJobID))
	}
	if s.Stuck || s.Err != nil {
		w.logger.ErrorContext(ctx, "ALERT stripe event not processed", append([]any{ledger.AlertStripeEventStuck.Attr()}, attrs...)...)
		return
	}
	w.logger.WarnContext(ctx, "stripe event's job was gone; it runs again", attrs...)
}

// JobStatesTx implements ledger.SweepJobs with River's job list.
func (s Scheduler) JobStatesTx(ctx context.Context, tx pgx.Tx, ids []int64) (map[int64]string, error) {
	states := make(map[int64]string, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), 1000)
		res, err := s.Client.JobListTx(ctx, tx, river.NewJobListParams().IDs(ids[:n]...).First(n))
		if err != nil {
			return nil, fmt.Errorf("error listing jobs: %w", err)
		}
		for _, j := range res.Jobs {
			states[j.ID] = string(j.State)
		}
		ids = ids[n:]
	}
	return states, nil
}

// JobRetryTx implements ledger.SweepJobs with River's JobRetryTx.
func (s Scheduler) JobRetryTx(ctx context.Context, tx pgx.Tx, id int64) error {
	if _, err := s.Client.JobRetryTx(ctx, tx, id); err != nil {
		return fmt.Errorf("error making job %d run again: %w", id, err)
	}
	return nil
}
