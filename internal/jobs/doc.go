// Package jobs holds Tally's River job kinds, their workers, and the River
// client setup that every process shares (schema river, queues, timeouts:
// client.go). Every job kind, with its queue:
//
//   - charge_period (charges): the money path of one (customer, period) —
//     charge_period.go (args; the job is inserted with its period) and
//     charge_period_worker.go (the worker);
//   - charge_resolve (charges, charge_resolve.go): an operator's resolve of
//     a double charge: refund every other PaymentIntent carrying the
//     charge's key, then settle the charge;
//   - stripe_event (webhooks, stripe_event.go): one stored Stripe webhook
//     event applied to the ledger;
//   - charge_reconcile (maintenance, maintenance.go, with reconcile.go): the
//     periodic reconciliation of quiet unsettled charges with Stripe;
//   - stripe_event_retention (maintenance, maintenance.go): the periodic
//     deletion of old processed webhook events;
//   - sweep (maintenance, sweep.go): the periodic look for lost charge jobs
//     and stuck Stripe events, and the expiry of credit grants;
//   - dunning_scan (maintenance, dunning.go): the periodic start of the
//     retries of past_due charges that are due;
//   - usage_rollup (maintenance, usage_rollup.go): the periodic roll-up of
//     the events committed since the last one, for the usage API, and the
//     record of usage thresholds crossed;
//   - webhook_delivery (webhook_deliveries, webhook_delivery.go): one
//     notification posted to one producer endpoint.
//
// The charge_period worker runs the charge job's steps in order
// (docs/design.md, "The money path"): 1. Pre-flight, 2. Close and claim,
// 3. Cancel, 4. Begin the retry, 5. Look up, 6. Record the look-up, 7. Call,
// 8. Record the outcome. The odd steps call Stripe, each call alone in its
// step; the even steps are one ledger transaction each (PeriodCloseClaim;
// ChargeRecordRetryPaid, ChargeCancelFinish or ChargeRetryBegin;
// ChargeRecordOutcome or ChargeLookupNone; ChargeRecordOutcome, which
// completes the job in its transaction). ChargeTimings derives the job
// timeout, the lease and River's rescue delay from the Stripe timeout.
//
// Beside the kinds: Scheduler (scheduler.go) implements ledger.Scheduler and
// ledger.SweepJobs with River; Stripe (stripe.go) is the part of Stripe's API
// the workers use, implemented by internal/stripeapi; ReconcileCharge
// (reconcile.go), Recover (recover.go) and Redrive (redrive.go) are what
// billingctl's reconcile, recover and redrive run; QueueStateGet
// (queue_state.go) reads River's jobs for the gauges, and QueueStatsKeep
// (queue_stats.go) keeps river_job's planner statistics current, so River's
// scheduling stays cheap at a mass close.
//
// Workers call internal/ledger for every write; the ledger never imports
// this package.
package jobs
