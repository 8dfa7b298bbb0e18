// Package ledger is Tally's domain: customers, plans, billing periods, the
// append-only usage ledger, charges, API keys, webhook endpoints, and every
// money operation with the SQL that runs it. It imports neither net/http nor
// River: internal/api and internal/jobs call into it, never the other way
// round, and it asks for jobs through two interfaces it declares,
// Scheduler (ledger.go: insert, reschedule and pause jobs in the caller's
// transaction, the outbox) and SweepJobs (sweep.go), which internal/jobs
// implements with River.
//
// Exported methods open and commit their own transaction unless their name
// ends in Tx, in which case they run in a ledger transaction the caller was
// handed (StripeEventHandle's, InTx's). Every transaction is a Tx (tx.go)
// and takes one `now` from Config.Clock, so tests control time. A Tx sends
// BEGIN with its first statement and a statement nothing needs at once with
// the statement after it; a queued read is a later, whose get sends it if
// it has not gone: round trips, not statements, are what a charge costs on
// a busy machine. plan.go says how statements whose best plan depends on
// table sizes are planned.
//
// One concept per file. The charge job's steps (docs/design.md, "The money
// path"), and the ledger function of each; the odd steps are Stripe calls,
// made by internal/jobs:
//
//  1. Pre-flight: ChargePreflight (period_close.go) says what to read from
//     Stripe before the close.
//  2. Close and claim: PeriodCloseClaim (period_close.go), one transaction:
//     the close (PeriodClose's work; the charge created by charge_create.go,
//     rated by charge_line.go, credits applied by credit_burn.go)
//     and the claim (ChargeClaim's work, charge_claim.go, with the guards of
//     charge_guard.go, the budget of charge_spend.go, the carry-forward of
//     charge_carry.go and the attempt row of charge_attempt.go).
//  3. Cancel: Stripe only, for a claim with Claim.Retry.
//  4. Begin the retry: ChargeRecordRetryPaid (charge_record.go),
//     ChargeCancelFinish or ChargeRetryBegin (charge_dunning.go).
//  5. Look up: Stripe only, for a claim with Claim.Lookup.
//  6. Record the look-up: ChargeRecordOutcome when a PaymentIntent was
//     found, ChargeLookupNone (charge_lookup.go) when none was.
//  7. Call: Stripe only, with Charge.IdempotencyKey (charge_key.go).
//  8. Record the outcome: ChargeRecordOutcome (charge_record.go), which
//     completes the job in its transaction.
//
// charge_outcome.go is the one way any outcome moves a charge
// (chargeApplyOutcomeTx), checked against the status machine of
// charge_status.go and, for a PaymentIntent, against payment_intent.go's
// check. Around the job: charge_reconcile.go applies what Stripe says later
// (webhooks, the reconciler); charge_action.go holds the operator's actions
// (approve, cancel, resolve); charge_dunning.go the retries of past_due
// charges; charge_recover.go gives back charges a restore lost; charging.go
// is the kill switch; charge_hold.go alerts held charges; charge_job.go runs
// a charge's job now. charge.go is the Charge itself, charge_transition.go
// the log of its status changes, charge_list.go and charge_public.go how it
// is listed and shown.
//
// Beside the money path: ingest (usage_event.go, usage_event_properties.go,
// period_open.go), periods (period.go, period_public.go), Stripe events and
// the refunds and disputes they carry (stripe_event.go, adjustment.go,
// refund.go, dispute.go), the notifications to producers and their delivery
// (notification.go, webhook_endpoint.go, webhook_delivery.go), usage
// thresholds (usage_threshold.go), the sweeps of lost jobs (sweep.go,
// period_sweep.go, stripe_event_sweep.go), API keys (api_key.go,
// api_key_cache.go), customers (customer.go), prepaid credits: grants, their
// voids and balances (credit.go) and their expiry (credit_expiry.go), plans
// and their versions
// (price_plan.go; what a price is and how it rates is internal/pricing's),
// currencies' limits (currency.go), the state the gauges show
// (operations_snapshot.go, operations_state.go), the ledger's settings from
// the environment (config_env.go) and the error kinds the API maps to
// statuses (errors.go).
package ledger
