// Package ledger is Tally's domain: customers, billing periods, the
// append-only usage ledger, API keys, and every money operation with the SQL
// that runs it. It never imports net/http; internal/api and internal/jobs
// call into it, never the other way round.
//
// Exported methods open and commit their own transaction unless their name
// ends in Tx, in which case they run in a ledger transaction the caller was
// handed (StripeEventHandle's, InTx's). Every transaction is a Tx (tx.go)
// and takes one `now` from Config.Clock, so tests control time. A Tx sends
// BEGIN with its first statement and a statement nothing needs at once with
// the statement after it; a queued read is a later, whose get sends it if
// it has not gone: round trips, not statements, are what a charge costs on
// a busy machine.
//
// One concept per file. The money path of a charge, in DESIGN.md's steps:
// period_close.go and charge_create.go (1, pre-flight, and 2, close),
// charge_claim.go with charge_guard.go, charge_spend.go and charge_carry.go
// (2, claim; the worker closes and claims in one transaction,
// PeriodCloseClaim, after ChargePreflight; a look-up at Stripe made before it
// that found nothing lets the claim mark the key's first use itself),
// charge_dunning.go (4, begin the retry), charge_lookup.go (6, record the
// look-up), charge_attempt.go (the attempt log around 7, the call),
// charge_record.go (8, record the outcome).
// charge_outcome.go is the one way any outcome moves a charge
// (chargeApplyOutcomeTx); charge_reconcile.go applies what Stripe says later
// (webhooks, the reconciler); charge_action.go holds the operator's actions;
// charge_status.go the status machine every move is checked against.
package ledger
