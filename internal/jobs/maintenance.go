package jobs

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/tally-billing/tally/internal/ledger"
)

// QueueMaintenance is the queue of the periodic jobs.
const QueueMaintenance = "maintenance"

// Defaults of the periodic jobs.
const (
	ReconcileIntervalDefault = 5 * time.Minute  // how often the reconciler runs
	ReconcileAfterDefault    = 10 * time.Minute // how long a charge must be quiet before it is reconciled
	reconcileBatchMax        = 500              // charges per reconciler run
	retentionInterval        = 6 * time.Hour
)

// ChargeReconcileArgs are the args of the reconciler, a periodic job.
type ChargeReconcileArgs struct{}

// Kind is the River job kind, "charge_reconcile".
func (ChargeReconcileArgs) Kind() string { return "charge_reconcile" }

// InsertOpts puts the job on QueueMaintenance.
func (ChargeReconcileArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance, UniqueOpts: river.UniqueOpts{ByPeriod: time.Minute}}
}

// ChargeReconcileWorker is the Janitor: it finds unsettled charges (pending,
// unknown, processing) whose lease has expired and whose last attempt is
// older than after, and brings each in line with Stripe (ReconcileCharge).
// River runs periodic jobs on its leader only; the ledger writes are guarded
// anyway, so a second run at once does no harm.
type ChargeReconcileWorker struct {
	river.WorkerDefaults[ChargeReconcileArgs]

	ledger *ledger.Ledger
	stripe Stripe
	logger *slog.Logger
	after  time.Duration
}

// reconcileTimeout bounds one reconciler run; River may rescue a run that
// takes longer, which is harmless: every write is monotonic.
const reconcileTimeout = 10 * time.Minute

// Timeout bounds a run; a long list of charges is taken up by the next run.
func (w *ChargeReconcileWorker) Timeout(*river.Job[ChargeReconcileArgs]) time.Duration {
	return reconcileTimeout
}

// Work reconciles one batch of stale charges.
func (w *ChargeReconcileWorker) Work(ctx context.Context, job *river.Job[ChargeReconcileArgs]) error {
	charges, err := w.ledger.ChargeListStale(ctx, w.ledger.Now().Add(-w.after), reconcileBatchMax)
	if err != nil {
		return err
	}
	counts := map[string]int{}
	for _, c := range charges {
		if ctx.Err() != nil {
			break // the next run goes on from where this one stopped
		}
		if err := w.ledger.ChargeMarkReconciled(ctx, c.ID); err != nil {
			return err
		}
		res, err := ReconcileCharge(ctx, w.ledger, w.stripe, c)
		if err != nil {
			counts["error"]++
			w.logger.WarnContext(ctx, "error reconciling charge", slog.Int64("charge_id", c.ID), slog.String("error", err.Error()))
			continue
		}
		counts[res.Action]++
		if res.Action == "resolved" {
			w.logger.InfoContext(ctx, "reconciler settled charge", slog.Int64("charge_id", c.ID),
				slog.String("status", string(res.Charge.Status)), slog.Any("payment_intents", paymentIntentIDs(res.PaymentIntents)))
		}
	}
	if len(charges) > 0 {
		w.logger.InfoContext(ctx, "reconciler run", slog.Int("charges", len(charges)), slog.Any("actions", counts))
	}
	// Holds are never silent: report again every charge held for a day.
	if _, err := w.ledger.ChargeHeldReport(ctx); err != nil {
		return err
	}
	if _, err := w.ledger.ChargingReport(ctx, ledger.ChargingPausedAlertAfter); err != nil {
		return err
	}
	return nil
}

// StripeEventRetentionArgs are the args of the periodic deletion of old,
// finished Stripe events.
type StripeEventRetentionArgs struct{}

// Kind is the River job kind, "stripe_event_retention".
func (StripeEventRetentionArgs) Kind() string { return "stripe_event_retention" }

// InsertOpts puts the job on QueueMaintenance.
func (StripeEventRetentionArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueMaintenance}
}

// StripeEventRetentionWorker deletes processed and ignored Stripe events
// older than its retention.
type StripeEventRetentionWorker struct {
	river.WorkerDefaults[StripeEventRetentionArgs]

	ledger    *ledger.Ledger
	logger    *slog.Logger
	retention time.Duration
}

// Work deletes the old events.
func (w *StripeEventRetentionWorker) Work(ctx context.Context, job *river.Job[StripeEventRetentionArgs]) error {
	n, err := w.ledger.StripeEventDeleteProcessed(ctx, w.ledger.Now().Add(-w.retention))
	if err != nil {
		return err
	}
	if n > 0 {
		w.logger.InfoContext(ctx, "deleted old stripe events", slog.Int64("count", n), slog.Duration("retention", w.retention))
	}
	return nil
}
