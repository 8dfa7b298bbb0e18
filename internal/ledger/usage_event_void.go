package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// A wrong usage event is corrected by voiding it while its period is open:
// the event stays as recorded and a void (billing.usage_event_voids) is
// appended, which every sum nets out (billing.usage_events_counted: the
// close, the period's totals, the thresholds, the views). A closed period's
// events are what its charge billed, so they cannot be voided.

// UsageEventVoidParams are the fields of UsageEventVoid.
type UsageEventVoidParams struct {
	CustomerID string
	EventID    string
	// Reason says why, for whoever reads the ledger later; 1 to 500 bytes.
	Reason string
	// Actor is who voids: operator:<key name>/<key prefix> or cli:<os user>.
	Actor string
}

// UsageEventVoid is a voided event's void.
type UsageEventVoid struct {
	CustomerID string
	EventID    string
	Period     string
	Reason     string
	VoidedBy   string
	VoidedAt   time.Time
	// Event is the event voided, as it was recorded.
	Event *UsageEvent
}

// UsageEventVoidResult is what UsageEventVoid did.
type UsageEventVoidResult struct {
	Void *UsageEventVoid
	// Replay is set when the event was voided already: Void is that first
	// void (with its reason), and nothing was written.
	Replay bool
}

// usageEventVoidReasonMax bounds a void's reason.
const usageEventVoidReasonMax = 500

// UsageEventVoid voids event p.EventID of customer p.CustomerID while its
// period is open. It holds the period FOR KEY SHARE, as ingest does, so a
// void either commits before the close takes the period (and the close
// leaves the event out) or finds it closed. Voiding an event voided already
// is a replay, whatever its period's state. It returns a *ValidationError
// for a bad field, a *NotFoundError for an event that does not exist, and a
// *ConflictError period_closed, which says how to make good, for an event of
// a period that is closed or past its close time.
func (l *Ledger) UsageEventVoid(ctx context.Context, p UsageEventVoidParams) (*UsageEventVoidResult, error) {
	fe := fieldErrors{}
	checkID(fe, "customer_id", p.CustomerID, true)
	checkID(fe, "event_id", p.EventID, true)
	switch {
	case p.Reason == "":
		fe.add("reason", "is required: say why the event is voided, such as \"sent twice under two event ids\"")
	case len(p.Reason) > usageEventVoidReasonMax || !utf8.ValidString(p.Reason) || strings.ContainsRune(p.Reason, 0):
		fe.add("reason", "must be 1 to %d bytes of UTF-8 text without NUL", usageEventVoidReasonMax)
	}
	if p.Actor == "" {
		fe.add("actor", "is required: who voids the event")
	}
	if err := fe.err(); err != nil {
		return nil, err
	}
	var res *UsageEventVoidResult
	err := l.withTx(ctx, func(tx *Tx) error {
		var err error
		res, err = l.usageEventVoidTx(ctx, tx, p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("error voiding event %q of customer %q: %w", p.EventID, p.CustomerID, err)
	}
	return res, nil
}

func (l *Ledger) usageEventVoidTx(ctx context.Context, tx *Tx, p UsageEventVoidParams) (*UsageEventVoidResult, error) {
	now := l.now()
	stored, err := scanUsageEvent(tx.QueryRow(ctx, `SELECT `+usageEventColumns+`
FROM billing.usage_events WHERE customer_id = $1 AND event_id = $2`, p.CustomerID, p.EventID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("event %q of customer %q", p.EventID, p.CustomerID)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading event: %w", err)
	}
	event := stored.event
	void, err := usageEventVoidGetTx(ctx, tx, event)
	if err != nil || void != nil {
		return &UsageEventVoidResult{Void: void, Replay: true}, err
	}

	var closesAt time.Time
	var closedAt *time.Time
	var chargeID *int64
	err = tx.QueryRow(ctx, `
SELECT p.closes_at, p.closed_at, (SELECT c.id FROM billing.charges c WHERE c.customer_id = p.customer_id AND c.period = p.period)
FROM billing.periods p WHERE p.customer_id = $1 AND p.period = $2
FOR KEY SHARE OF p`, p.CustomerID, event.Period).Scan(&closesAt, &closedAt, &chargeID)
	if err != nil {
		return nil, fmt.Errorf("error locking period: %w", err)
	}
	if closedAt != nil || !now.Before(closesAt) {
		return nil, voidPeriodClosedError(event, closedAt, closesAt, chargeID)
	}
	tag, err := tx.Exec(ctx, `
INSERT INTO billing.usage_event_voids (customer_id, event_id, period, reason, voided_by, voided_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (customer_id, event_id) DO NOTHING`, p.CustomerID, p.EventID, event.Period, p.Reason, p.Actor, now)
	if err != nil {
		return nil, fmt.Errorf("error inserting void: %w", err)
	}
	void, err = usageEventVoidGetTx(ctx, tx, event)
	if err == nil && void == nil {
		err = errors.New("the void inserted is not there")
	}
	return &UsageEventVoidResult{Void: void, Replay: tag.RowsAffected() == 0}, err
}

// usageEventVoidGetTx returns the void of event, or nil when it has none.
func usageEventVoidGetTx(ctx context.Context, tx *Tx, event *UsageEvent) (*UsageEventVoid, error) {
	v := UsageEventVoid{Event: event}
	err := tx.QueryRow(ctx, `
SELECT customer_id, event_id, period, reason, voided_by, voided_at FROM billing.usage_event_voids
WHERE customer_id = $1 AND event_id = $2`, event.CustomerID, event.EventID).Scan(
		&v.CustomerID, &v.EventID, &v.Period, &v.Reason, &v.VoidedBy, &v.VoidedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("error reading void: %w", err)
	}
	return &v, nil
}

// voidPeriodClosedError is the period_closed conflict of voiding event,
// whose period is closed (closedAt) or past its close time: what happened,
// and how to make good.
func voidPeriodClosedError(event *UsageEvent, closedAt *time.Time, closesAt time.Time, chargeID *int64) *ConflictError {
	when := fmt.Sprintf("stopped taking changes at its close time, %s, and is being closed and charged",
		closesAt.UTC().Format(time.RFC3339))
	if closedAt != nil {
		when = fmt.Sprintf("was closed at %s", closedAt.UTC().Format(time.RFC3339))
	}
	charge := "its charge"
	if chargeID != nil {
		charge = fmt.Sprintf("charge %d", *chargeID)
	}
	return &ConflictError{Code: ConflictPeriodClosed, Detail: fmt.Sprintf(
		"period %s of customer %s %s, so its events are what %s bills and event %q can no longer be voided. "+
			"To make good: once the charge has succeeded, refund the event's amount on the charge's PaymentIntent in "+
			"Stripe (Tally records the refund from Stripe's webhook: GET /v1/charges/{id} lists it); if it has not "+
			"been paid yet, an operator can cancel it (POST /v1/charges/{id}/cancel) and bill the corrected amount "+
			"outside Tally", event.Period, event.CustomerID, when, charge, event.EventID)}
}
