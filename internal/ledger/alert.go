package ledger

import "log/slog"

// Alert is the key of an ALERT line: the value of its alert attribute
// (alert=charge_held), which alert rules on the logs match on. Every key
// Tally raises is declared here, each with the section of docs/operations.md
// (its runbook) that says what it means and what moves it on; a line
// carries one through Attr. The ledger raises most of them, the jobs the
// others.
type Alert string

const (
	// AlertChargeHeld is a charge moved into held (or still held a day
	// later, or whose resolve was refused): it waits for an operator.
	// Runbook: docs/operations.md#the-held-alert.
	AlertChargeHeld Alert = "charge_held"

	// AlertDoubleCharge is a second PaymentIntent carrying a charge's key:
	// the customer may have paid twice. An unsettled charge is held too.
	// Runbook: docs/operations.md#held-double_charge.
	AlertDoubleCharge Alert = "double_charge"

	// AlertPaymentIntentMismatch is a PaymentIntent carrying a charge's key
	// that differs from the charge (amount, currency, customer, mode). An
	// unsettled charge is held too.
	// Runbook: docs/operations.md#held-payment_intent_mismatch.
	AlertPaymentIntentMismatch Alert = "payment_intent_mismatch"

	// AlertSettledChargePaid is Stripe saying a PaymentIntent succeeded for
	// a charge Tally had settled without it (canceled, failed, carried
	// forward). Runbook: docs/operations.md#alert-settled_charge_paid.
	AlertSettledChargePaid Alert = "settled_charge_paid"

	// AlertRetiredPaymentIntentSucceeded is news that a PaymentIntent a
	// dunning retry canceled succeeded.
	// Runbook: docs/operations.md#alert-retired_payment_intent_succeeded.
	AlertRetiredPaymentIntentSucceeded Alert = "retired_payment_intent_succeeded"

	// AlertResolveAmountDiffers is a resolve that kept a PaymentIntent for
	// another amount or currency than the charge's.
	// Runbook: docs/operations.md#alert-resolve_amount_differs.
	AlertResolveAmountDiffers Alert = "resolve_amount_differs"

	// AlertChargingPaused is the kill switch on, reported at every
	// reconciler run: no charge or refund moves money.
	// Runbook: docs/operations.md#kill-switch.
	AlertChargingPaused Alert = "charging_paused"

	// AlertChargingDiscrepancy is the kill switch changed outside Tally: the
	// operator log does not say who or why.
	// Runbook: docs/operations.md#kill-switch.
	AlertChargingDiscrepancy Alert = "charging_discrepancy"

	// AlertPeriodJobLost is a period open past its close whose charge job is
	// gone. Runbook: docs/operations.md#alert-period_job_lost.
	AlertPeriodJobLost Alert = "period_job_lost"

	// AlertStripeEventStuck is a Stripe event not processed long after it
	// came. Runbook: docs/operations.md#alert-stripe_event_stuck.
	AlertStripeEventStuck Alert = "stripe_event_stuck"

	// AlertWebhookDeliveryFailed is a notification not delivered to an
	// endpoint, with no attempt left.
	// Runbook: docs/operations.md#webhook-endpoint-disabled.
	AlertWebhookDeliveryFailed Alert = "webhook_delivery_failed"

	// AlertWebhookEndpointDisabled is an endpoint disabled after failing
	// every delivery for days. Runbook: docs/operations.md#webhook-endpoint-disabled.
	AlertWebhookEndpointDisabled Alert = "webhook_endpoint_disabled"

	// AlertTopUpHeld is a top-up held by a guard or by an answer a human
	// must look at. Runbook: docs/operations.md#alert-top_up_held.
	AlertTopUpHeld Alert = "top_up_held"

	// AlertTopUpStuck is a top-up not settled long after its last move; the
	// sweep makes its job run again. Runbook: docs/operations.md#alert-top_up_stuck.
	AlertTopUpStuck Alert = "top_up_stuck"

	// AlertTopUpPaidUnrecorded is a PaymentIntent carrying a top-up's key
	// that succeeded on Stripe but that the top-up cannot record (it was
	// canceled, or settled with another PaymentIntent): money moved with no
	// grant for it. Runbook: docs/operations.md#alert-top_up_paid_unrecorded.
	AlertTopUpPaidUnrecorded Alert = "top_up_paid_unrecorded"
)

// Attr is a's attribute on a log line: alert=<a>.
func (a Alert) Attr() slog.Attr {
	return slog.String("alert", string(a))
}
