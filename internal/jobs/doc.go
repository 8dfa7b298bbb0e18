// Package jobs holds Tally's River job kinds and the River client setup that
// every process shares (schema river, queue names, timeouts):
//
//   - charge_period: the money path — charge_period.go (args, the job's
//     insertion with its period) and charge_period_worker.go (the worker);
//   - charge_resolve (charge_resolve.go): an operator's resolution of a held
//     or unknown charge;
//   - charge_reconcile and stripe_event_retention (maintenance.go): the
//     periodic reconciliation with Stripe and the pruning of processed
//     webhook events;
//   - stripe_event (stripe_event.go): one Stripe webhook event applied;
//   - sweep (sweep.go): the periodic look for lost charge jobs and stuck
//     events.
//
// Beside them, QueueStatsKeep (queue_stats.go) keeps river_job's planner
// statistics current, so River's scheduling stays cheap at a mass close.
//
// Workers call internal/ledger for every step and Stripe through the small
// Stripe interface (stripe.go; internal/stripeapi implements it); the ledger
// never imports this package.
package jobs
