package jobs

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/schema"
	"github.com/tally-billing/tally/internal/stripeapi"
	"github.com/tally-billing/tally/internal/webhook"
)

// NewInsertClient returns a River client that inserts jobs but works none,
// for API-only replicas, billingctl and tests.
func NewInsertClient(pool *pgxpool.Pool, logger *slog.Logger) (*river.Client[pgx.Tx], error) {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger: logger,
		Schema: schema.RiverSchema,
	})
	if err != nil {
		return nil, fmt.Errorf("error creating river client: %w", err)
	}
	return client, nil
}

// ConcurrencyDefault is WorkerConfig.Concurrency (TALLY_WORKERS) when zero:
// charge jobs spend most of their time waiting on Stripe, holding no
// connection, so one replica works many at once.
const ConcurrencyDefault = 50

// WorkerConfig configures a worker replica's River client.
type WorkerConfig struct {
	// Ledger runs every step of the jobs. Required.
	Ledger *ledger.Ledger

	// Stripe is the payments API. Required.
	Stripe Stripe

	// StripeTimeout is the bound on one Stripe call, from which the job
	// timeout, lease and rescue delay follow (ChargeTimings). Default
	// stripeapi.TimeoutDefault.
	StripeTimeout time.Duration

	// Concurrency is the number of charge jobs worked at once. Default
	// ConcurrencyDefault.
	Concurrency int

	// Logger receives River's and the workers' logs. Required.
	Logger *slog.Logger

	// RetryMaxDelay caps River's retry backoff (attempt⁴ seconds) for every
	// job; the server defaults it to RetryMaxDelayDefault. Zero keeps River's
	// own.
	RetryMaxDelay time.Duration

	// RetryPolicy overrides River's retry backoff (tests).
	RetryPolicy river.ClientRetryPolicy

	// ReconcileInterval is how often the reconciler runs. Default
	// ReconcileIntervalDefault.
	ReconcileInterval time.Duration

	// ReconcileAfter is how long an unsettled charge must be quiet before the
	// reconciler looks at it. Default ReconcileAfterDefault.
	ReconcileAfter time.Duration

	// StripeEventRetention is how long processed Stripe events are kept.
	// Default ledger.StripeEventRetentionDefault.
	StripeEventRetention time.Duration

	// SweepInterval is how often the sweep (SweepWorker) looks for periods
	// and Stripe events whose job was lost. Default SweepIntervalDefault.
	SweepInterval time.Duration

	// SweepAfter is how long a period must be past its closes_at, or a
	// Stripe event past its receipt, before the sweep runs a job of it that
	// cannot run any more again. Default SweepAfterDefault.
	SweepAfter time.Duration

	// StripeEventStuckAttempts is how many failed attempts make an
	// unprocessed Stripe event stuck (ALERT stripe_event_stuck). Default
	// StripeEventStuckAttemptsDefault.
	StripeEventStuckAttempts int

	// StripeEventStuckAfter is how long after its receipt an unprocessed
	// Stripe event is stuck, whatever its attempts. Default
	// StripeEventStuckAfterDefault.
	StripeEventStuckAfter time.Duration

	// UsageRollupInterval is how often the usage roll-up runs (it also
	// checks the usage thresholds). Default UsageRollupIntervalDefault.
	UsageRollupInterval time.Duration

	// DunningInterval is how often the dunning scan starts the retries of
	// past_due charges that are due. Default DunningIntervalDefault.
	DunningInterval time.Duration

	// DeliveryWorkers is how many webhook deliveries are made at once.
	// Default DeliveryWorkersDefault.
	DeliveryWorkers int

	// DeliveryTimeout bounds one delivery attempt. Default
	// DeliveryTimeoutDefault.
	DeliveryTimeout time.Duration

	// DeliveryAllow are the non-public networks deliveries may connect to
	// (TALLY_WEBHOOKS_ALLOW_CIDRS); every other non-public address is
	// refused, checked on the address dialled (webhook.AddressPolicy).
	// Empty: public addresses only.
	DeliveryAllow []netip.Prefix

	// crashHook is passed to the charge worker (tests only).
	crashHook func(point string) error

	// retryLaterSnooze, when set (tests only), replaces the 429 snooze bounds.
	retryLaterSnooze time.Duration
}

// NewWorkerClient returns a River client that works Tally's queues with every
// worker registered. Start it to begin working.
func NewWorkerClient(pool *pgxpool.Pool, config WorkerConfig) (*river.Client[pgx.Tx], error) {
	if config.StripeTimeout == 0 {
		config.StripeTimeout = stripeapi.TimeoutDefault
	}
	if config.Concurrency == 0 {
		config.Concurrency = ConcurrencyDefault
	}
	jobTimeout, leaseTTL, rescueAfter := ChargeTimings(config.StripeTimeout)
	worker := &ChargePeriodWorker{
		ledger: config.Ledger, stripe: config.Stripe, logger: config.Logger,
		jobTimeout: jobTimeout, leaseTTL: leaseTTL, stripeTimeout: config.StripeTimeout, host: hostID(),
		crashHook:     config.crashHook,
		retryLaterMin: retryLaterSnoozeMin, retryLaterMax: retryLaterSnoozeMax,
	}
	if config.retryLaterSnooze > 0 {
		worker.retryLaterMin, worker.retryLaterMax = config.retryLaterSnooze, config.retryLaterSnooze
	}
	if config.RetryPolicy == nil && config.RetryMaxDelay > 0 {
		config.RetryPolicy = cappedRetry{max: config.RetryMaxDelay}
	}
	config.ReconcileInterval = cmp.Or(config.ReconcileInterval, ReconcileIntervalDefault)
	config.ReconcileAfter = cmp.Or(config.ReconcileAfter, ReconcileAfterDefault)
	config.StripeEventRetention = cmp.Or(config.StripeEventRetention, ledger.StripeEventRetentionDefault)
	config.SweepInterval = cmp.Or(config.SweepInterval, SweepIntervalDefault)
	config.SweepAfter = cmp.Or(config.SweepAfter, SweepAfterDefault)
	config.StripeEventStuckAttempts = cmp.Or(config.StripeEventStuckAttempts, StripeEventStuckAttemptsDefault)
	config.StripeEventStuckAfter = cmp.Or(config.StripeEventStuckAfter, StripeEventStuckAfterDefault)

	config.UsageRollupInterval = cmp.Or(config.UsageRollupInterval, UsageRollupIntervalDefault)
	config.DunningInterval = cmp.Or(config.DunningInterval, DunningIntervalDefault)
	config.DeliveryWorkers = cmp.Or(config.DeliveryWorkers, DeliveryWorkersDefault)
	config.DeliveryTimeout = cmp.Or(config.DeliveryTimeout, DeliveryTimeoutDefault)

	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	river.AddWorker(workers, &TopUpWorker{
		ledger: config.Ledger, stripe: config.Stripe, logger: config.Logger,
		jobTimeout: jobTimeout, leaseTTL: leaseTTL, stripeTimeout: config.StripeTimeout, host: hostID(),
		crashHook: config.crashHook, retryLaterMin: worker.retryLaterMin, retryLaterMax: worker.retryLaterMax,
	})
	river.AddWorker(workers, &StripeEventWorker{ledger: config.Ledger, logger: config.Logger, livemode: config.Stripe.Livemode()})
	river.AddWorker(workers, &ChargeResolveWorker{ledger: config.Ledger, stripe: config.Stripe, logger: config.Logger})
	river.AddWorker(workers, &ChargeReconcileWorker{
		ledger: config.Ledger, stripe: config.Stripe, logger: config.Logger, after: config.ReconcileAfter,
	})
	river.AddWorker(workers, &StripeEventRetentionWorker{
		ledger: config.Ledger, logger: config.Logger, retention: config.StripeEventRetention,
	})
	river.AddWorker(workers, &UsageRollupWorker{ledger: config.Ledger, logger: config.Logger})
	river.AddWorker(workers, &DunningScanWorker{ledger: config.Ledger, logger: config.Logger})
	river.AddWorker(workers, newWebhookDeliveryWorker(config.Ledger, config.Logger, config.DeliveryTimeout,
		newDeliveryDialer(webhook.AddressPolicy{Allow: config.DeliveryAllow}, config.DeliveryTimeout)))
	river.AddWorker(workers, &SweepWorker{
		ledger: config.Ledger, logger: config.Logger, after: config.SweepAfter,
		stuckAttempts: config.StripeEventStuckAttempts, stuckAfter: config.StripeEventStuckAfter,
	})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger: config.Logger,
		Schema: schema.RiverSchema,
		Queues: queueConfigs(config),
		PeriodicJobs: []*river.PeriodicJob{
			river.NewPeriodicJob(river.PeriodicInterval(config.ReconcileInterval),
				func() (river.JobArgs, *river.InsertOpts) { return ChargeReconcileArgs{}, nil },
				&river.PeriodicJobOpts{ID: "charge_reconcile", RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(retentionInterval),
				func() (river.JobArgs, *river.InsertOpts) { return StripeEventRetentionArgs{}, nil },
				&river.PeriodicJobOpts{ID: "stripe_event_retention", RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(config.SweepInterval),
				func() (river.JobArgs, *river.InsertOpts) { return SweepArgs{}, nil },
				&river.PeriodicJobOpts{ID: "sweep", RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(config.UsageRollupInterval),
				func() (river.JobArgs, *river.InsertOpts) { return UsageRollupArgs{}, nil },
				&river.PeriodicJobOpts{ID: "usage_rollup", RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(config.DunningInterval),
				func() (river.JobArgs, *river.InsertOpts) { return DunningScanArgs{}, nil },
				&river.PeriodicJobOpts{ID: "dunning_scan", RunOnStart: true}),
		},
		Workers: workers,
		// Every job kind gets the charge job's timeout; River rescues a job
		// only after the charge lease it may hold has expired.
		JobTimeout:           jobTimeout,
		RescueStuckJobsAfter: rescueAfter,
		RetryPolicy:          config.RetryPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("error creating river worker client: %w", err)
	}
	return client, nil
}

// Queues are the River queues Tally runs, each worked by every worker
// replica: QueueCharges (the kill switch pauses it), QueueWebhooks,
// QueueMaintenance and QueueDeliveries. Their pause is Tally's to set, so
// River UI may not pause or resume them.
var Queues = []string{QueueCharges, QueueWebhooks, QueueMaintenance, QueueDeliveries}

// queueConfigs is the River configuration of each of Queues for config.
func queueConfigs(config WorkerConfig) map[string]river.QueueConfig {
	return map[string]river.QueueConfig{
		QueueCharges:     {MaxWorkers: config.Concurrency, FetchPollInterval: chargesFetchPollInterval},
		QueueWebhooks:    {MaxWorkers: 10},
		QueueMaintenance: {MaxWorkers: 2},
		QueueDeliveries:  {MaxWorkers: config.DeliveryWorkers},
	}
}

// RetryMaxDelayDefault caps retries at an hour, so a charge job's 25
// attempts span about a day, the length of the Stripe key window.
const RetryMaxDelayDefault = time.Hour

// cappedRetry is River's default backoff, capped at max.
type cappedRetry struct{ max time.Duration }

// NextRetry implements river.ClientRetryPolicy.
func (p cappedRetry) NextRetry(job *rivertype.JobRow) time.Time {
	next := (&river.DefaultClientRetryPolicy{}).NextRetry(job)
	if limit := time.Now().Add(p.max); next.After(limit) {
		return limit
	}
	return next
}

// chargesFetchPollInterval is how often a worker replica looks for charge
// jobs that became due without a notification: River announces a job when
// it is inserted or scheduled, not when its scheduled time (the period's
// close) passes, so its default, 1 s, would start a closing period's charges
// up to a second late. Each poll is one indexed read of river_job.
const chargesFetchPollInterval = 200 * time.Millisecond
