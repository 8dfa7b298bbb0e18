package ledger

import (
	"fmt"
	"strings"
)

// ChargeStatus is the status of a charge (docs/design.md, Charge states).
// chargeTransitions says which changes are allowed and who may make each;
// the trigger billing.charges_status_guard enforces the same pairs in
// Postgres.
type ChargeStatus string

// Charge statuses. Terminal ones never change again.
const (
	ChargePending    ChargeStatus = "pending"    // committed before money moves; a worker may claim it
	ChargeProcessing ChargeStatus = "processing" // Stripe accepted an async payment; a webhook decides
	ChargeUnknown    ChargeStatus = "unknown"    // a call's outcome was lost; resolved by retry, webhook or reconcile
	ChargeHeld       ChargeStatus = "held"       // waits for an operator (HeldReason says why)
	ChargeSucceeded  ChargeStatus = "succeeded"
	ChargeFailed     ChargeStatus = "failed"
	ChargeSkipped    ChargeStatus = "skipped"  // the period's total was zero
	ChargeCovered    ChargeStatus = "covered"  // credits paid the period's whole total; no Stripe call
	ChargeCanceled   ChargeStatus = "canceled" // an operator canceled it; no money moved

	// ChargeCarriedForward: below Stripe's minimum for its currency; never
	// sent, its amount is billed by the customer's next charge (CarriedInto).
	ChargeCarriedForward ChargeStatus = "carried_forward"

	// ChargePastDue: Stripe declined it for a reason a later try can fix
	// (DeclineRetryable); it is retried at NextRetryAt (the dunning
	// schedule, Config.DunningSchedule).
	ChargePastDue ChargeStatus = "past_due"

	// ChargeUncollectible: its last scheduled retry was declined too.
	ChargeUncollectible ChargeStatus = "uncollectible"
)

// ChargeStatuses lists every status, in the order of the status machine.
var ChargeStatuses = []ChargeStatus{ChargePending, ChargeProcessing, ChargeUnknown, ChargeHeld,
	ChargeSucceeded, ChargeFailed, ChargeSkipped, ChargeCovered, ChargeCanceled, ChargeCarriedForward, ChargePastDue,
	ChargeUncollectible}

// chargeStatusList names every status for an error message: "pending,
// processing, … or carried_forward".
func chargeStatusList() string {
	names := make([]string, len(ChargeStatuses))
	for i, s := range ChargeStatuses {
		names[i] = string(s)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// Valid reports whether s is a known status.
func (s ChargeStatus) Valid() bool {
	for _, v := range ChargeStatuses {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether s never changes again, except that a failed or
// uncollectible charge takes the late success of its own PaymentIntent.
func (s ChargeStatus) Terminal() bool {
	switch s {
	case ChargeSucceeded, ChargeFailed, ChargeSkipped, ChargeCovered, ChargeCanceled, ChargeCarriedForward, ChargeUncollectible:
		return true
	}
	return false
}

// Chargeable reports whether a worker may claim a charge in s and call
// Stripe for it: pending or unknown.
func (s ChargeStatus) Chargeable() bool { return s == ChargePending || s == ChargeUnknown }

// HeldReason says why a charge waits for an operator.
type HeldReason string

// Held reasons. docs/operations.md says, for each, what it means and the
// command that moves the charge on; HeldReason.Exit says it in one line.
const (
	HeldOverCustomerCap       HeldReason = "over_customer_cap"       // amount above the customer's max_charge_cents
	HeldOverPeriodBudget      HeldReason = "over_period_budget"      // would exceed TALLY_PERIOD_BUDGET_CENTS
	HeldAnomaly               HeldReason = "anomaly"                 // far above the customer's usual charge
	HeldIdempotencyError      HeldReason = "idempotency_error"       // Stripe has the key with other parameters
	HeldPaymentIntentMismatch HeldReason = "payment_intent_mismatch" // a PaymentIntent carries the key but differs
	HeldDoubleCharge          HeldReason = "double_charge"           // several PaymentIntents carry the key
	HeldUnexpectedStatus      HeldReason = "unexpected_status"       // Stripe answered a status Tally never expects
	HeldAmountTooLarge        HeldReason = "amount_too_large"        // above Stripe's largest amount for one PaymentIntent
	HeldNoPaymentMethod       HeldReason = "no_payment_method"       // Stripe has no payment method for the customer, and dunning is off
)

// HeldReasons lists every held reason.
var HeldReasons = []HeldReason{HeldOverCustomerCap, HeldOverPeriodBudget, HeldAnomaly, HeldIdempotencyError,
	HeldPaymentIntentMismatch, HeldDoubleCharge, HeldUnexpectedStatus, HeldAmountTooLarge, HeldNoPaymentMethod}

// Conflicting reports whether a hold for r is about a PaymentIntent that
// conflicts with the charge (a double charge, a mismatch): money moved, so the
// charge is resolved, never charged again nor canceled.
func (r HeldReason) Conflicting() bool {
	return r == HeldDoubleCharge || r == HeldPaymentIntentMismatch
}

// Approvable reports whether a charge held for r may be approved (charged
// with the same key rules as any charge). Not a conflicting hold (resolve
// it), nor an amount Stripe refuses whatever the operator says (cancel it).
func (r HeldReason) Approvable() bool {
	return !r.Conflicting() && r != HeldAmountTooLarge
}

// Exit names the operator's way out of a hold for r, for alert lines.
func (r HeldReason) Exit(chargeID int64) string {
	switch r {
	case HeldDoubleCharge, HeldPaymentIntentMismatch:
		return fmt.Sprintf("billingctl charges resolve %d --keep pi_… --reason \"…\" (keeps one PaymentIntent, refunds the others)", chargeID)
	case HeldIdempotencyError:
		return fmt.Sprintf("billingctl charges approve %d --reason \"…\" (looks at Stripe, then calls with the next key)", chargeID)
	case HeldAmountTooLarge:
		return fmt.Sprintf("billingctl charges cancel %d --reason \"…\" (Stripe refuses it; bill it outside Tally or in parts)", chargeID)
	case HeldNoPaymentMethod:
		return fmt.Sprintf("give the customer a payment method (PUT /v1/customers/ID with stripe_payment_method_id, or a default one on Stripe), then billingctl charges approve %d --reason \"…\" (calls with it and the next key)", chargeID)
	case HeldUnexpectedStatus:
		return fmt.Sprintf("settle the PaymentIntent in Stripe (capture or cancel it), then billingctl charges approve %d --reason \"…\" (its look-up takes the PaymentIntent's outcome)", chargeID)
	}
	return fmt.Sprintf("billingctl charges approve %d --reason \"…\" (charge it anyway) or billingctl charges cancel %d --reason \"…\"", chargeID, chargeID)
}

// OutcomeClass classifies one Stripe answer (docs/design.md, Outcomes).
type OutcomeClass string

// Outcome classes.
const (
	OutcomeSucceeded  OutcomeClass = "succeeded"   // the PaymentIntent succeeded
	OutcomeProcessing OutcomeClass = "processing"  // accepted, settles later; a webhook decides
	OutcomeFailed     OutcomeClass = "failed"      // declined, authentication required, invalid request: final
	OutcomeUnknown    OutcomeClass = "unknown"     // timeout, network error, 5xx: money may have moved
	OutcomeRetryLater OutcomeClass = "retry_later" // 429 or idempotency_key_in_use: nothing happened, try again soon
	OutcomeHeld       OutcomeClass = "held"        // idempotency_error or another impossible answer: a human must look
	OutcomeError      OutcomeClass = "error"       // refused before anything happened (bad API key, …): retry with backoff
)

// ActorKind is who makes a transition: the kinds the transition table names.
type ActorKind string

// Actor kinds. An actor string (charge_transitions.actor) starts with its
// kind: job:<id>/<attempt>, webhook:<event id>, reconciler, operator:<key
// name and prefix>, cli:<os user>.
const (
	ActorJob        ActorKind = "job"
	ActorWebhook    ActorKind = "webhook"
	ActorReconciler ActorKind = "reconciler"
	ActorOperator   ActorKind = "operator" // an API key with the admin scope, or billingctl
)

// actorKind returns the kind of an actor string.
func actorKind(actor string) ActorKind {
	kind, _, _ := strings.Cut(actor, ":")
	switch kind {
	case "job", "test":
		return ActorJob
	case "webhook":
		return ActorWebhook
	case "reconciler":
		return ActorReconciler
	}
	return ActorOperator // operator:…, cli:…
}

// chargeTransitions is the status machine: every allowed change of status,
// and who may make it. Staying in a status is always allowed (a new key
// generation, an alert). billing.charge_status_transitions holds the same
// pairs, and Postgres refuses any other change.
var chargeTransitions = map[[2]ChargeStatus][]ActorKind{
	{ChargePending, ChargeProcessing}:     {ActorJob, ActorWebhook, ActorReconciler},
	{ChargePending, ChargeSucceeded}:      {ActorJob, ActorWebhook, ActorReconciler},
	{ChargePending, ChargeFailed}:         {ActorJob, ActorWebhook, ActorReconciler},
	{ChargePending, ChargeUnknown}:        {ActorJob},
	{ChargePending, ChargeHeld}:           {ActorJob, ActorWebhook, ActorReconciler},
	{ChargePending, ChargeCanceled}:       {ActorOperator},
	{ChargePending, ChargeCarriedForward}: {ActorJob}, // below Stripe's minimum

	{ChargeUnknown, ChargePending}:    {ActorJob}, // the next key generation
	{ChargeUnknown, ChargeProcessing}: {ActorJob, ActorWebhook, ActorReconciler},
	{ChargeUnknown, ChargeSucceeded}:  {ActorJob, ActorWebhook, ActorReconciler},
	{ChargeUnknown, ChargeFailed}:     {ActorJob, ActorWebhook, ActorReconciler},
	{ChargeUnknown, ChargeHeld}:       {ActorJob, ActorWebhook, ActorReconciler},

	{ChargeProcessing, ChargeSucceeded}: {ActorJob, ActorWebhook, ActorReconciler},
	{ChargeProcessing, ChargeFailed}:    {ActorJob, ActorWebhook, ActorReconciler},
	{ChargeProcessing, ChargeHeld}:      {ActorJob, ActorWebhook, ActorReconciler},

	{ChargeHeld, ChargePending}:   {ActorOperator}, // approve
	{ChargeHeld, ChargeSucceeded}: {ActorJob, ActorWebhook, ActorReconciler, ActorOperator},
	{ChargeHeld, ChargeCanceled}:  {ActorOperator},

	{ChargeFailed, ChargeSucceeded}: {ActorJob, ActorWebhook, ActorReconciler}, // its own PaymentIntent succeeded later

	// Dunning: a retryable decline, the retry (the next key generation once
	// every PaymentIntent of the charge that could still succeed is
	// canceled), the end of the schedule, a late success.
	{ChargePending, ChargePastDue}:          {ActorJob, ActorWebhook, ActorReconciler},
	{ChargeUnknown, ChargePastDue}:          {ActorJob, ActorWebhook, ActorReconciler},
	{ChargeProcessing, ChargePastDue}:       {ActorJob, ActorWebhook, ActorReconciler},
	{ChargePending, ChargeUncollectible}:    {ActorJob, ActorWebhook, ActorReconciler},
	{ChargeUnknown, ChargeUncollectible}:    {ActorJob, ActorWebhook, ActorReconciler},
	{ChargeProcessing, ChargeUncollectible}: {ActorJob, ActorWebhook, ActorReconciler},
	{ChargePastDue, ChargePending}:          {ActorJob},
	{ChargePastDue, ChargeProcessing}:       {ActorJob, ActorReconciler}, // never a webhook: its snapshot may predate the decline
	{ChargePastDue, ChargeSucceeded}:        {ActorJob, ActorWebhook, ActorReconciler},
	{ChargePastDue, ChargeHeld}:             {ActorJob, ActorWebhook, ActorReconciler},
	{ChargePastDue, ChargeCanceled}:         {ActorOperator},                           // an operator's cancel, carried out by the charge job once its PaymentIntents are canceled
	{ChargeUncollectible, ChargeSucceeded}:  {ActorJob, ActorWebhook, ActorReconciler}, // its own PaymentIntent succeeded later
}

// ChargeTransitionAllowed reports whether a charge may move from from to to,
// made by an actor of kind by. Staying in a status is always allowed.
func ChargeTransitionAllowed(from, to ChargeStatus, by ActorKind) bool {
	if from == to {
		return true
	}
	for _, k := range chargeTransitions[[2]ChargeStatus{from, to}] {
		if k == by {
			return true
		}
	}
	return false
}

// ChargeTransitionPairs returns every (from, to) pair of the status machine,
// whoever makes it.
func ChargeTransitionPairs() [][2]ChargeStatus {
	pairs := make([][2]ChargeStatus, 0, len(chargeTransitions))
	for p := range chargeTransitions {
		pairs = append(pairs, p)
	}
	return pairs
}
