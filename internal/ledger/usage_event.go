package ledger

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/apd/v3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tally-billing/tally/internal/pricing"
)

// OccurredAtFutureMax is how far in the future an event's occurred_at may be
// (clock skew between producer and Tally).
const OccurredAtFutureMax = 5 * time.Minute

// UsageEventBatchMax is the most events one batch may hold.
const UsageEventBatchMax = 1000

// UsageEventParams is one usage event as a producer posts it: either
// pre-priced (AmountCents, billed as sent; Metric optional, a label) or a
// quantity event (Metric and Quantity, priced by the customer's plan), never
// both.
type UsageEventParams struct {
	CustomerID string
	EventID    string // the producer's idempotency key, unique per customer
	// AmountCents is the event's price in minor units of the period's
	// currency, priced by the producer; 0 for none (a quantity event).
	AmountCents int64
	Currency    string // optional; must equal the period's currency when given
	// Quantity is how much of Metric was used, an exact decimal as sent (a
	// JSON number's text, or a decimal string such as "12.5"; at most 12
	// digits after the point, see pricing.ParseQuantity); "" for none. The
	// period's plan version must price Metric.
	Quantity   string
	Metric     string // required with Quantity; otherwise optional
	Properties json.RawMessage
	OccurredAt *time.Time // optional; default: now
}

// UsageEvent is a stored usage event.
type UsageEvent struct {
	ID         int64
	CustomerID string
	EventID    string
	Period     string
	// AmountCents is a pre-priced event's amount; 0 for a quantity event
	// (the column is NULL), which its period's plan version prices.
	AmountCents int64
	Currency    string
	// Quantity is a quantity event's quantity, exact (nil for a pre-priced
	// event; an event recorded before quantity events existed may carry
	// one beside its amount).
	Quantity   *apd.Decimal
	Metric     *string
	Properties json.RawMessage
	OccurredAt time.Time
	ReceivedAt time.Time
}

// UsageEventResult is the outcome of recording one event: the stored event,
// and whether it had been recorded before with the same payload (a replay).
type UsageEventResult struct {
	Event  *UsageEvent
	Replay bool
}

// preparedEvent is a validated event with its canonical payload hash.
type preparedEvent struct {
	UsageEventParams
	index       int
	hash        []byte
	properties  []byte
	occurredAt  time.Time
	periodBound Bounds

	// quantity is Quantity's canonical text (no exponent, no trailing
	// zeros), "" for none.
	quantity string

	// periodCurrency and periodPlan are set once the period is found open,
	// and periodPriced when its plan version prices the event's metric.
	periodCurrency string
	periodPlan     planRef
	periodPriced   bool
}

// prepare validates p against now and computes its hash and period.
func (l *Ledger) prepare(p UsageEventParams, now time.Time) (*preparedEvent, error) {
	fe := fieldErrors{}
	checkID(fe, "customer_id", p.CustomerID, true)
	checkID(fe, "event_id", p.EventID, true)
	quantity := checkAmountOrQuantity(fe, p)
	p.Currency = strings.ToLower(p.Currency)
	if p.Currency != "" {
		checkCurrency(fe, "currency", p.Currency)
	}
	checkID(fe, "metric", p.Metric, false)

	props, err := UsageEventProperties(p.Properties)
	var ve *ValidationError
	if errors.As(err, &ve) {
		for field, msg := range ve.Fields {
			fe.add(field, "%s", msg)
		}
	}

	occurredAt := now
	if p.OccurredAt != nil {
		occurredAt = p.OccurredAt.UTC().Truncate(time.Microsecond)
		if occurredAt.After(now.Add(OccurredAtFutureMax)) {
			fe.add("occurred_at", "is %s in the future; send a time at most %s ahead of now (%s)",
				occurredAt.Sub(now).Round(time.Second), OccurredAtFutureMax, now.Format(time.RFC3339))
		}
	}
	if err := fe.err(); err != nil {
		return nil, err
	}

	// The hash covers the payload as sent (an omitted occurred_at or currency
	// stays omitted), so an exact re-post always matches.
	sent := ""
	if p.OccurredAt != nil {
		sent = occurredAt.Format(time.RFC3339Nano)
	}
	// The quantity goes in as its canonical text, a JSON number: 12.5,
	// "12.50" and 1.25e1 are one payload, and an integer quantity hashes as
	// the int64 quantities of before did.
	var q json.RawMessage
	if quantity != "" {
		q = json.RawMessage(quantity)
	}
	canonical, _ := json.Marshal(struct {
		CustomerID  string          `json:"customer_id"`
		EventID     string          `json:"event_id"`
		AmountCents int64           `json:"amount_cents"`
		Currency    string          `json:"currency"`
		Quantity    json.RawMessage `json:"quantity"`
		Metric      string          `json:"metric"`
		Properties  json.RawMessage `json:"properties"`
		OccurredAt  string          `json:"occurred_at"`
	}{p.CustomerID, p.EventID, p.AmountCents, p.Currency, q, p.Metric, props, sent})
	sum := sha256.Sum256(canonical)

	return &preparedEvent{
		UsageEventParams: p,
		quantity:         quantity,
		hash:             sum[:],
		properties:       props,
		occurredAt:       occurredAt,
		periodBound:      l.config.Cadence.Bounds(occurredAt),
	}, nil
}

// checkAmountOrQuantity adds a message to fe unless p is either pre-priced
// (a valid AmountCents, no Quantity) or a quantity event (Metric and a valid
// Quantity, no AmountCents), and returns the quantity's canonical text, ""
// for none.
func checkAmountOrQuantity(fe fieldErrors, p UsageEventParams) string {
	var quantity string
	if p.Quantity != "" {
		q, err := pricing.ParseQuantity(p.Quantity)
		if err != nil {
			fe.add("quantity", "%s", err.Error())
		} else {
			quantity = q.Text('f')
		}
		if p.Metric == "" {
			fe.add("metric", "is required with quantity: send the metric the quantity is of, such as \"api_calls\", which the customer's plan prices")
		}
	}
	switch {
	case p.AmountCents != 0 && p.Quantity != "":
		both := "send either amount_cents (an amount you priced, billed as sent) or metric and quantity " +
			"(priced by the customer's plan), not both"
		fe.add("amount_cents", "%s", both)
		fe.add("quantity", "%s", both)
	case p.AmountCents == 0 && p.Quantity == "":
		fe.add("amount_cents", "is required unless the event sends metric and quantity: the event's price in "+
			"minor units of the customer's currency, such as 1250 for $12.50 (or a quantity of a metric the "+
			"customer's plan prices, such as \"metric\":\"api_calls\",\"quantity\":12)")
	case p.AmountCents < 0 || p.AmountCents > AmountCentsMax:
		fe.add("amount_cents", "must be a whole number of minor units between 1 and %d; got %d", AmountCentsMax, p.AmountCents)
	}
	return quantity
}

// UsageEventRecord records one usage event; see UsageEventRecordBatch for the
// rules. It returns a *ValidationError, *ConflictError or
// *UnpricedMetricError (not a BatchError) when the event is rejected.
//
// Concurrent calls share statements and commits (usage_event_group.go): a
// call that finds a writer free is written at once, alone; the others wait
// for the next group. The common case — a new event for a period that is
// open — is one statement for the whole group (usageEventInsertOpen,
// usageEventsInsertOpen); everything else (the period's first event, a
// replay, a conflict, a closed period, a currency mismatch) takes the batch
// path, which explains it, event by event. A call returns once the commit
// that holds its event (or its answer) is done.
func (l *Ledger) UsageEventRecord(ctx context.Context, p UsageEventParams) (*UsageEventResult, error) {
	ev, err := l.prepare(p, l.now())
	if err != nil {
		return nil, err
	}
	return l.recordGrouped(ctx, ev)
}

// UsageEventRecordBatch records events all-or-nothing in one transaction and
// returns one result per event, in order.
//
// For each event: an event_id already stored for the customer with the same
// payload is a replay (returned as stored, nothing written), with a different
// payload an idempotency_conflict. Otherwise the customer must exist, the
// event's period (derived from occurred_at) must be open and before its close
// time, and the currency must match the period's; a quantity event's metric
// must be priced by the period's plan version (the one in force when the
// period opened), else it is refused with an *UnpricedMetricError. The
// first event of a period
// creates the period row and inserts its charge job in the same transaction.
// The period row is held FOR KEY SHARE while events are inserted, so a
// concurrent close (FOR UPDATE) either sees the event or makes it fail with
// period_closed.
//
// When any event fails, nothing is written and a *BatchError gives the error
// of each failing index. It returns a *ValidationError (field "events") when
// the batch is empty or holds more than UsageEventBatchMax events.
func (l *Ledger) UsageEventRecordBatch(ctx context.Context, params []UsageEventParams) ([]*UsageEventResult, error) {
	return l.recordBatch(ctx, params, true)
}

// UsageEventCheckBatch checks events exactly as UsageEventRecordBatch would
// record them, and writes nothing: it returns the *BatchError that recording
// would, or nil. The API uses it to report every problem of a batch whose
// other items it could not even decode.
func (l *Ledger) UsageEventCheckBatch(ctx context.Context, params []UsageEventParams) error {
	_, err := l.recordBatch(ctx, params, false)
	return err
}

func (l *Ledger) recordBatch(ctx context.Context, params []UsageEventParams, commit bool) ([]*UsageEventResult, error) {
	if len(params) == 0 || len(params) > UsageEventBatchMax {
		return nil, &ValidationError{Fields: map[string]string{
			"events": fmt.Sprintf("must hold between 1 and %d events; got %d", UsageEventBatchMax, len(params)),
		}}
	}
	now := l.now()
	events := make([]*preparedEvent, len(params))
	itemErrs := map[int]error{}
	for i, p := range params {
		ev, err := l.prepare(p, now)
		if err != nil {
			itemErrs[i] = err
			continue
		}
		ev.index = i
		events[i] = ev
	}
	valid := make([]*preparedEvent, 0, len(events))
	for _, ev := range events {
		if ev != nil {
			valid = append(valid, ev)
		}
	}

	// Valid items are checked against the ledger even when others failed
	// validation, so the caller learns every problem at once; the transaction
	// then rolls back. The batch's events are first expected to be new (a
	// plain insert); when one is taken, the transaction runs again with the
	// insert that skips and explains them.
	var results []*UsageEventResult
	var err error
	for _, expectNew := range []bool{true, false} {
		err = l.withTx(ctx, func(tx *Tx) error {
			found, dbErrs, err := l.recordTx(ctx, tx, now, len(events), valid, expectNew)
			if err != nil {
				return err
			}
			for i, e := range dbErrs {
				itemErrs[i] = e
			}
			if len(itemErrs) > 0 || !commit {
				return errRollback
			}
			results = found
			return nil
		})
		if !errors.Is(err, errEventTaken) {
			break
		}
	}
	if errors.Is(err, errRollback) && len(itemErrs) == 0 {
		return nil, nil // checked, nothing wrong, nothing written
	}
	if errors.Is(err, errRollback) {
		return nil, &BatchError{Items: itemErrs}
	}
	if err != nil {
		return nil, fmt.Errorf("error recording %d usage events: %w", len(events), err)
	}
	return results, nil
}

// errRollback makes withTx roll back a transaction whose items failed.
var errRollback = errors.New("rollback")

// recordTx records events (a batch of n, by index) in tx in three steps that
// keep lock order stable across concurrent batches (periods sorted, then
// events sorted), so two batches never deadlock each other:
//  1. for each (customer, period), in sorted order: check the customer,
//     create the period and its charge job when missing, and lock the
//     period FOR KEY SHARE, requiring it open and in the event's currency;
//  2. insert the events of open periods in (customer, event_id) order, in
//     one statement, with ON CONFLICT DO NOTHING: the statement a group of
//     single events runs (usageEventsInsertOpen), which reads each event's
//     period from its locked row, so the check that every event's period
//     exists (a statement trigger) has nothing to do; with expectNew, a plain
//     insert of them all, which fails with errEventTaken when one is taken;
//  3. look up every event not inserted — a conflict with a stored row or an
//     earlier item, or one whose period refused it — and answer it as the
//     stored event's replay or idempotency conflict when one is stored (an
//     exact re-post is a replay even once its period closed), else with the
//     period's error.
func (l *Ledger) recordTx(ctx context.Context, tx *Tx, now time.Time, n int, events []*preparedEvent, expectNew bool) ([]*UsageEventResult, map[int]error, error) {
	results := make([]*UsageEventResult, n)
	itemErrs := map[int]error{}

	sorted := slices.Clone(events)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.CustomerID != b.CustomerID {
			return a.CustomerID < b.CustomerID
		}
		return a.EventID < b.EventID
	})

	periodErrs, err := l.periodsOpenTx(ctx, tx, now, sorted)
	if err != nil {
		return nil, nil, err
	}
	var insert, unsure []*preparedEvent
	refused := map[*preparedEvent]error{} // the error of an event not stored
	for _, ev := range sorted {
		if perr, ok := periodErrs[periodKey{ev.CustomerID, ev.periodBound.Label}]; ok {
			refused[ev] = perr
			unsure = append(unsure, ev)
			continue
		}
		if ev.Currency != "" && ev.Currency != ev.periodCurrency {
			refused[ev] = &ValidationError{Fields: map[string]string{"currency": fmt.Sprintf(
				"must be %q, the currency of period %s of customer %s; send %q or omit currency",
				ev.periodCurrency, ev.periodBound.Label, ev.CustomerID, ev.periodCurrency)}}
			unsure = append(unsure, ev)
			continue
		}
		if ev.quantity != "" && !ev.periodPriced {
			refused[ev] = unpricedMetricError(ev)
			unsure = append(unsure, ev)
			continue
		}
		insert = append(insert, ev)
	}

	inserted := map[eventKey]*UsageEvent{}
	if len(insert) > 0 {
		if expectNew {
			inserted, err = usageEventsInsertNew(ctx, tx, now, insert)
		} else {
			inserted, err = usageEventsInsertOpen(ctx, tx, usageEventsInsertOpenSQL, now, insert)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	for _, ev := range insert {
		k := eventKey{ev.CustomerID, ev.EventID}
		if e, ok := inserted[k]; ok {
			results[ev.index] = &UsageEventResult{Event: e}
			delete(inserted, k) // a later item with the same key collided with this one
			continue
		}
		unsure = append(unsure, ev)
	}
	if len(unsure) == 0 {
		return results, itemErrs, nil
	}

	stored, err := usageEventsFind(ctx, tx, unsure)
	if err != nil {
		return nil, nil, err
	}
	for _, ev := range unsure {
		s, ok := stored[eventKey{ev.CustomerID, ev.EventID}]
		if refusal := refused[ev]; !ok && refusal != nil {
			itemErrs[ev.index] = refusal
			continue
		}
		res, err := compareStored(ev, s)
		if err != nil {
			itemErrs[ev.index] = err
			continue
		}
		results[ev.index] = res
	}
	return results, itemErrs, nil
}

type eventKey struct{ customerID, eventID string }

type periodKey struct{ customerID, period string }

type storedEvent struct {
	event *UsageEvent
	hash  []byte
}

func compareStored(ev *preparedEvent, s storedEvent) (*UsageEventResult, error) {
	if s.event == nil {
		// Unreachable: a conflicting row is visible once its insert committed.
		return nil, fmt.Errorf("event %s/%s conflicted but is not visible", ev.CustomerID, ev.EventID)
	}
	if !bytes.Equal(s.hash, ev.hash) {
		return nil, &ConflictError{Code: ConflictIdempotency, Detail: fmt.Sprintf(
			"event_id %q of customer %s was already recorded with a different payload; "+
				"send the original payload to replay it, or use a new event_id for a new event",
			ev.EventID, ev.CustomerID)}
	}
	return &UsageEventResult{Event: s.event, Replay: true}, nil
}

// unpricedMetricError is the UnpricedMetricError of quantity event ev,
// whose period was found open.
func unpricedMetricError(ev *preparedEvent) *UnpricedMetricError {
	where := fmt.Sprintf("period %s of customer %s", ev.periodBound.Label, ev.CustomerID)
	var detail string
	if ev.periodPlan.ID == nil {
		detail = fmt.Sprintf("metric %q has no price: %s has no plan (its customer had none when it opened), so "+
			"Tally cannot price a quantity in it. Send this event with amount_cents (the amount you priced) instead "+
			"of quantity; to have Tally price %q, put the customer on a plan that prices it (PUT /v1/customers/%s "+
			"with \"plan_id\"), which applies from the customer's next period",
			ev.Metric, where, ev.Metric, ev.CustomerID)
	} else {
		plan := *ev.periodPlan.ID
		detail = fmt.Sprintf("metric %q has no price in version %d of plan %s, which prices %s. Send this event "+
			"with amount_cents (the amount you priced) instead of quantity, or check the metric's name; to have "+
			"Tally price %q, put a price for it in plan %s (PUT /v1/plans/%s), which applies from the customer's "+
			"next period", ev.Metric, *ev.periodPlan.Version, plan, where, ev.Metric, plan, plan)
	}
	return &UnpricedMetricError{Metric: ev.Metric, Detail: detail}
}

const usageEventColumns = `id, customer_id, event_id, period, coalesce(amount_cents, 0), currency, quantity::text,
       metric, properties, occurred_at, received_at, payload_hash`

func scanUsageEvent(row pgx.Row) (storedEvent, error) {
	var e UsageEvent
	var hash []byte
	var quantity *string
	err := row.Scan(&e.ID, &e.CustomerID, &e.EventID, &e.Period, &e.AmountCents, &e.Currency,
		&quantity, &e.Metric, &e.Properties, &e.OccurredAt, &e.ReceivedAt, &hash)
	if err != nil {
		return storedEvent{}, err
	}
	if quantity != nil {
		if e.Quantity, err = quantityOf(*quantity); err != nil {
			return storedEvent{}, err
		}
	}
	return storedEvent{event: &e, hash: hash}, nil
}

// quantityOf returns the decimal whose text is s: a quantity as stored
// (numeric's text), or as ingest stores it (canonical). Both spell a
// quantity the same way, so an event answers the same whether just stored
// or read back.
func quantityOf(s string) (*apd.Decimal, error) {
	d, _, err := apd.NewFromString(s)
	if err != nil {
		return nil, fmt.Errorf("error reading quantity %q: %w", s, err)
	}
	return d, nil
}

// amountOrNull is a pre-priced event's amount, nil (NULL) for a quantity
// event.
func amountOrNull(ev *preparedEvent) *int64 {
	if ev.AmountCents == 0 {
		return nil
	}
	return &ev.AmountCents
}

// orNull is s, nil (NULL) when empty.
func orNull(s *string) *string {
	if *s == "" {
		return nil
	}
	return s
}

// usageEventsFind returns the stored events among events' (customer, event_id).
func usageEventsFind(ctx context.Context, tx *Tx, events []*preparedEvent) (map[eventKey]storedEvent, error) {
	customers := make([]string, len(events))
	ids := make([]string, len(events))
	for i, ev := range events {
		customers[i], ids[i] = ev.CustomerID, ev.EventID
	}
	rows, err := tx.Query(ctx, `
SELECT `+usageEventColumns+`
FROM billing.usage_events
WHERE (customer_id, event_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, planFresh, customers, ids)
	if err != nil {
		return nil, fmt.Errorf("error finding stored events: %w", err)
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (storedEvent, error) { return scanUsageEvent(r) })
	if err != nil {
		return nil, fmt.Errorf("error finding stored events: %w", err)
	}
	m := make(map[eventKey]storedEvent, len(found))
	for _, s := range found {
		m[eventKey{s.event.CustomerID, s.event.EventID}] = s
	}
	return m, nil
}

// usageEventsInsertOpenSQL is usageEventInsertOpenSQL for many events: it
// inserts, in one statement, every event whose period exists, is open and
// before its close, and has the event's currency (or the event names none),
// whose quantity (if any) the period's plan version prices, and whose
// (customer, event_id) is new — the first of the statement's events with a
// key, when several share it. Rows go in in (customer, event_id) order, as
// recordTx's do, so two groups that share keys never deadlock each other.
// The periods are locked FOR KEY SHARE in (customer, period) byte order, as
// periodsLockTx does, each looked up by its primary key in a LATERAL
// subquery: a join would let the planner hash the periods table (with ten
// events and a thousand periods it did, custom plan or generic), and the
// lookup by key keeps the plan an index scan per period under any
// statistics, so the statement is prepared once (no planFresh). Each
// inserted row comes from its period's locked row, so the statement marks
// itself as usageEventInsertOpenSQL does (migration 00018).
const usageEventsInsertOpenSQL = `
WITH e AS MATERIALIZED (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[],
                       $8::text[], $9::timestamptz[], $11::bytea[])
       WITH ORDINALITY AS e (customer_id, event_id, period, amount_cents, currency, quantity, metric,
                             properties, occurred_at, payload_hash, n)
), p AS MATERIALIZED (
  SELECT p.customer_id, p.period, p.currency, p.status, p.closes_at, p.plan_id, p.plan_version,
         set_config('tally.event_period_held', pg_current_xact_id()::text || '@' || statement_timestamp()::text, true)
  FROM (SELECT customer_id, period FROM e GROUP BY customer_id, period ORDER BY customer_id COLLATE "C", period COLLATE "C") k
  CROSS JOIN LATERAL (SELECT * FROM billing.periods p
                      WHERE p.customer_id = k.customer_id AND p.period = k.period
                      FOR KEY SHARE) p
)
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, quantity,
                                  metric, properties, occurred_at, received_at, payload_hash)
SELECT e.customer_id, e.event_id, e.period, e.amount_cents, p.currency, e.quantity::numeric, e.metric,
       e.properties::jsonb, e.occurred_at, $10, e.payload_hash
FROM e JOIN p ON p.customer_id = e.customer_id AND p.period = e.period
WHERE p.status = 'open' AND p.closes_at > $10 AND (e.currency = '' OR e.currency = p.currency)
  AND (e.quantity IS NULL OR EXISTS (SELECT 1 FROM billing.plan_prices pp
                                     WHERE pp.plan_id = p.plan_id AND pp.version = p.plan_version AND pp.metric = e.metric))
ORDER BY e.customer_id COLLATE "C", e.event_id COLLATE "C", e.n
ON CONFLICT (customer_id, event_id) DO NOTHING
RETURNING ` + insertedColumns

// usageEventsInsertNewSQL is usageEventsInsertOpenSQL without ON CONFLICT,
// for events expected to be new: it inserts them all, or fails with a
// unique violation on (customer_id, event_id) when one is taken. Postgres
// inserts a row plainly for less than a row it may have to take back (a
// speculative insertion writes the row, then confirms it: in psql, 1,000
// rows took 15–16 ms without ON CONFLICT against 20–21 ms with).
var usageEventsInsertNewSQL = strings.Replace(usageEventsInsertOpenSQL,
	"\nON CONFLICT (customer_id, event_id) DO NOTHING\n", "\n", 1)

// errEventTaken is usageEventsInsertNew's error when an event's
// (customer, event_id) is taken; the transaction is aborted.
var errEventTaken = errors.New("an event's (customer, event_id) is taken")

// usageEventsInsertNew records events expected to be new in one statement
// (usageEventsInsertNewSQL): every one of them, or none and errEventTaken
// when one is stored already (a replay or a conflict), was inserted by a
// transaction that committed meanwhile, or appears twice among events.
func usageEventsInsertNew(ctx context.Context, tx *Tx, now time.Time, events []*preparedEvent) (map[eventKey]*UsageEvent, error) {
	rows, err := tx.Query(ctx, usageEventsInsertNewSQL, eventArgs(events, now)...)
	inserted, err := readInserted(rows, err, events, now)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && eventKeyConstraint.MatchString(pgErr.ConstraintName) {
		return nil, errEventTaken
	}
	return inserted, err
}

// eventKeyConstraint matches the names a unique violation of an event's
// (customer_id, event_id) comes with: usage_events_customer_event_key, or,
// since billing.usage_events is partitioned (migration 00031), the index of
// the partition the row went to, usage_events_p00_customer_event_key to
// usage_events_p15_customer_event_key.
var eventKeyConstraint = regexp.MustCompile(`^usage_events(_p[0-9]{2})?_customer_event_key$`)

// usageEventsInsertOpen records events with query, usageEventsInsertOpenSQL
// or its function (usageEventsInsertOpenCall), and returns those it inserted
// by key; the caller finds out why the others were not. A group of single
// events calls the function alone, its own transaction; a batch (recordTx)
// runs the statement once its periods are created and locked and its
// refusals taken out, so it inserts every event the batch does not find
// stored.
func usageEventsInsertOpen(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, query string, now time.Time, events []*preparedEvent,
) (map[eventKey]*UsageEvent, error) {
	rows, err := db.Query(ctx, query, eventArgs(events, now)...)
	return readInserted(rows, err, events, now)
}

// usageEventInsertOpenCall and usageEventsInsertOpenCall run
// usageEventInsertOpenSQL and usageEventsInsertOpenSQL as the functions whose
// bodies they are (migration 00030, TestInsertFunctionsAreTheStatements):
// the function's plan is cached by the server connection, so the statements
// of single events are planned once per connection even where Tally
// prepares no named statement (through a pooler in transaction mode,
// postgres.ConnectPooled).
const (
	usageEventInsertOpenCall  = `SELECT * FROM billing.usage_event_insert_open($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`
	usageEventsInsertOpenCall = `SELECT * FROM billing.usage_events_insert_open($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`
)

// eventArgs are the arguments of an insert of events from unnest, $1 to
// $11: customers, event ids, periods, amounts, currencies (as
// sent, "" for none), quantities, metrics, properties, occurrence times, now
// and payload hashes.
func eventArgs(events []*preparedEvent, now time.Time) []any {
	n := len(events)
	var (
		customers, ids, periods, currencies, properties = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		amounts                                         = make([]*int64, n)
		quantities, metrics                             = make([]*string, n), make([]*string, n)
		occurred                                        = make([]time.Time, n)
		hashes                                          = make([][]byte, n)
	)
	for i, ev := range events {
		customers[i], ids[i], periods[i], currencies[i] = ev.CustomerID, ev.EventID, ev.periodBound.Label, ev.Currency
		amounts[i], quantities[i], metrics[i] = amountOrNull(ev), orNull(&ev.quantity), orNull(&ev.Metric)
		properties[i], occurred[i], hashes[i] = string(ev.properties), ev.occurredAt, ev.hash
	}
	return []any{customers, ids, periods, amounts, currencies, quantities, metrics, properties, occurred, now, hashes}
}

// insertedColumns are what an insert of events returns: only what Postgres
// made (the id, and the properties as jsonb writes them) and the currency
// it stored, beside the key.
const insertedColumns = `customer_id, event_id, id, currency, properties`

// readInserted reads the rows of an insert of events (insertedColumns),
// or returns its error, err: the inserted events by key. The row inserted
// for a key is its first event in events (a later one conflicted with it).
func readInserted(rows pgx.Rows, err error, events []*preparedEvent, now time.Time) (map[eventKey]*UsageEvent, error) {
	n := len(events)
	if err != nil {
		return nil, fmt.Errorf("error inserting %d events: %w", n, err)
	}
	first := make(map[eventKey]*preparedEvent, n)
	for _, ev := range events {
		if k := (eventKey{ev.CustomerID, ev.EventID}); first[k] == nil {
			first[k] = ev
		}
	}
	inserted := make(map[eventKey]*UsageEvent, n)
	var k eventKey
	var id int64
	var currency string
	var props json.RawMessage
	_, err = pgx.ForEachRow(rows, []any{&k.customerID, &k.eventID, &id, &currency, &props}, func() error {
		ev := first[k]
		if ev == nil {
			return fmt.Errorf("inserted %s/%s, which the statement was not given", k.customerID, k.eventID)
		}
		e := &UsageEvent{ID: id, CustomerID: ev.CustomerID, EventID: ev.EventID, Period: ev.periodBound.Label,
			AmountCents: ev.AmountCents, Currency: currency,
			Properties: append(json.RawMessage(nil), props...), OccurredAt: ev.occurredAt, ReceivedAt: now}
		if ev.Metric != "" {
			metric := ev.Metric
			e.Metric = &metric
		}
		if ev.quantity != "" {
			q, err := quantityOf(ev.quantity)
			if err != nil {
				return err
			}
			e.Quantity = q
		}
		inserted[k] = e
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error inserting %d events: %w", n, err)
	}
	return inserted, nil
}

// usageEventInsertOpenSQL inserts one event when its period exists, is open
// and before its close, and has the event's currency (or the event names
// none), and its (customer, event_id) is new. The period row is read FOR KEY
// SHARE in the same statement, so a concurrent close (FOR UPDATE) either
// waits for this event or, once it committed, makes the statement insert
// nothing: the lock returns the row as the close left it. The period is
// found by its primary key alone and its status checked after the lock, so
// the plan is an index lookup of one row whatever the statistics say (with
// status and closes_at in the lookup, a planner without statistics picks the
// partial index of open periods and filters every open period). A quantity
// event ($6 not null) is inserted only when the period's plan version prices
// its metric, a look-up by key in billing.plan_prices; a pre-priced event
// never makes it (OR stops at its first true argument). Inserting
// only from the period's row, it marks itself (tally.event_period_held) so
// that the check that every event's period exists skips it (migration 00018):
// the value is this statement's alone, its transaction and start time.
const usageEventInsertOpenSQL = `
WITH p AS MATERIALIZED (
  SELECT currency, status, closes_at, plan_id, plan_version,
         set_config('tally.event_period_held', pg_current_xact_id()::text || '@' || statement_timestamp()::text, true)
  FROM billing.periods
  WHERE customer_id = $1 AND period = $3
  FOR KEY SHARE
)
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, quantity,
                                  metric, properties, occurred_at, received_at, payload_hash)
SELECT $1, $2, $3, $4, p.currency, $6::text::numeric, $7, $8, $9, $10, $11 FROM p
WHERE p.status = 'open' AND p.closes_at > $10 AND ($5::text = '' OR $5::text = p.currency)
  AND ($6::text IS NULL OR EXISTS (SELECT 1 FROM billing.plan_prices pp
                                   WHERE pp.plan_id = p.plan_id AND pp.version = p.plan_version AND pp.metric = $7))
ON CONFLICT (customer_id, event_id) DO NOTHING
RETURNING ` + usageEventColumns

// usageEventInsertOpen records ev in one statement (usageEventInsertOpenSQL,
// called as its function: usageEventInsertOpenCall) and returns it, or nil
// when the statement inserted nothing and the caller must find out why.
func usageEventInsertOpen(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, now time.Time, ev *preparedEvent,
) (*UsageEvent, error) {
	s, err := scanUsageEvent(db.QueryRow(ctx, usageEventInsertOpenCall,
		ev.CustomerID, ev.EventID, ev.periodBound.Label, amountOrNull(ev), ev.Currency, orNull(&ev.quantity),
		orNull(&ev.Metric), ev.properties, ev.occurredAt, now, ev.hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("error inserting event %s/%s: %w", ev.CustomerID, ev.EventID, err)
	}
	return s.event, nil
}
