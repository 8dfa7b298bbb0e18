package ledger

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrNotFound is returned when the requested customer, period, charge or API
// key does not exist.
var ErrNotFound = errors.New("not found")

// NotFoundError names what does not exist ("period 2026-11 of customer
// \"acme\""); errors.Is(err, ErrNotFound) holds for it. Its message is what
// a client is told, however the error was wrapped on the way up.
type NotFoundError struct{ What string }

func (e *NotFoundError) Error() string { return e.What + " not found" }

// Is makes a NotFoundError match ErrNotFound.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// notFound returns a *NotFoundError for what format says.
func notFound(format string, args ...any) error {
	return &NotFoundError{What: fmt.Sprintf(format, args...)}
}

// ErrUnauthenticated is returned by APIKeyAuthenticate for an unknown or
// revoked key.
var ErrUnauthenticated = errors.New("invalid or revoked API key")

// ValidationError reports input that breaks a rule, field by field. Fields
// are named as in the HTTP API's JSON (customer_id, amount_cents, …), and
// each message says what to send instead. Nothing was written.
type ValidationError struct {
	Fields map[string]string
}

func (e *ValidationError) Error() string {
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+": "+e.Fields[k])
	}
	return "invalid input: " + strings.Join(parts, "; ")
}

// fieldErrors collects validation messages; err returns nil when there are
// none.
type fieldErrors map[string]string

func (f fieldErrors) add(field, format string, args ...any) {
	if _, ok := f[field]; !ok {
		f[field] = fmt.Sprintf(format, args...)
	}
}

func (f fieldErrors) err() error {
	if len(f) == 0 {
		return nil
	}
	return &ValidationError{Fields: f}
}

// Conflict codes, stable strings that clients may switch on.
const (
	// ConflictIdempotency: the event_id was already used with a different
	// payload. Send a new event_id, or the original payload unchanged.
	ConflictIdempotency = "idempotency_conflict"

	// ConflictPeriodClosed: the event's billing period is closed (or past
	// its close time) and its charge is computed; the event cannot be added.
	// Post it with an occurred_at in a period still open (or none: now),
	// whose charge then counts it.
	ConflictPeriodClosed = "period_closed"

	// ConflictGrantIDReused: a grant_id already names another grant of the
	// customer; choose a new grant_id (or void that grant and grant again).
	ConflictGrantIDReused = "grant_id_reused"

	// ConflictGrantExhausted: the grant has nothing left to void (used up
	// or expired).
	ConflictGrantExhausted = "grant_exhausted"

	// ConflictChargeNotSettled: the charge has no statement yet; one is
	// issued when it settles (succeeded, or covered by credits).
	ConflictChargeNotSettled = "charge_not_settled"

	// ConflictChargeNotHeld: approve and resolve act on held charges only
	// (and approve not on a double charge or a mismatch: resolve those).
	ConflictChargeNotHeld = "charge_not_held"

	// ConflictChargeOutcomeUnknown: money may have moved for the charge
	// (an attempt's outcome is unknown, or a PaymentIntent succeeded), so it
	// cannot be canceled; reconcile it first (billingctl reconcile).
	ConflictChargeOutcomeUnknown = "charge_outcome_unknown"

	// ConflictChargeLeased: a worker is charging it right now; try again
	// when its lease (see the charge's lease_expires_at) has passed.
	ConflictChargeLeased = "charge_leased"

	// ConflictChargeNotCancelable: the charge is settled (or in a status
	// that only Stripe moves on); it cannot be canceled.
	ConflictChargeNotCancelable = "charge_not_cancelable"

	// ConflictChargeNotPastDue: only a past_due charge (declined, with
	// retries left) can be retried.
	ConflictChargeNotPastDue = "charge_not_past_due"

	// ConflictTopUpIDReused: a top_up_id already names another top-up of
	// the customer; choose a new top_up_id.
	ConflictTopUpIDReused = "top_up_id_reused"

	// ConflictTopUpNotCancelable: only a held top-up, or a pending one never
	// sent to Stripe, can be canceled.
	ConflictTopUpNotCancelable = "top_up_not_cancelable"
)

// ConflictError reports a request that is valid on its own but conflicts with
// what the ledger already holds. Nothing was written.
type ConflictError struct {
	Code   string
	Detail string
}

func (e *ConflictError) Error() string { return e.Code + ": " + e.Detail }

// UnpricedMetricError reports a quantity event whose metric its period's
// plan version has no price for (or whose period has no plan): the close
// could not price it, so it is refused. Nothing was written. Its message
// names the metric and says what to do: send the event with amount_cents,
// or price the metric in the plan, which applies from the customer's next
// period.
type UnpricedMetricError struct {
	Metric string
	Detail string
}

func (e *UnpricedMetricError) Error() string { return "unpriced_metric: " + e.Detail }

// BatchError reports a rejected batch: the errors of each failing item by its
// index in the request (each a *ValidationError, *ConflictError or
// *UnpricedMetricError). Nothing of the batch was written.
type BatchError struct {
	Items map[int]error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("batch rejected: %d of its items failed", len(e.Items))
}
