package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Single events share commits (group commit). A Postgres commit costs the
// same for one event as for fifty, and on a busy server most of an event's
// cost is its statement and its commit, not its row. So concurrent calls of
// UsageEventRecord are gathered: at most IngestWriters groups are written at
// once, and an event that arrives while they are all busy waits in a queue
// until one is free; the writer then takes the whole queue (up to
// IngestGroupMax events) and writes it in one statement, one commit. There
// is no timer: an event that finds a writer free is written at once, alone,
// exactly as before grouping (the linger is the time the busy writers take),
// so a lone client's latency does not change, and the busier the server, the
// larger the groups.
//
// Each call gets its own answer, after the commit that holds its event: a
// replay, a conflict, a closed period or an unpriced metric is that event's
// alone (writeGroup). A group whose statement or transaction fails fails
// every call in it, and none of them is acknowledged.

// IngestGroupMaxDefault is Config.IngestGroupMax's default: how many single
// events one shared statement may hold.
const IngestGroupMaxDefault = 64

// IngestWritersDefault is Config.IngestWriters's default: how many groups
// of single events are written at once.
const IngestWritersDefault = 2

// eventGroups gathers the single events of UsageEventRecord into groups.
type eventGroups struct {
	mu      sync.Mutex
	queue   []*groupedEvent
	writing int // groups being written, at most writers
	writers int
	max     int
}

// groupedEvent is one call of UsageEventRecord in a group.
type groupedEvent struct {
	ev *preparedEvent

	// wake is closed once the event is answered (res or err set), or when
	// a writer handed this call a group to write (lead set).
	wake chan struct{}
	lead []*groupedEvent

	res *UsageEventResult
	err error
}

// recordGrouped records ev, alone when a writer is free, else in the group
// the next free writer takes.
func (l *Ledger) recordGrouped(ctx context.Context, ev *preparedEvent) (*UsageEventResult, error) {
	g := &l.groups
	me := &groupedEvent{ev: ev, wake: make(chan struct{})}
	g.mu.Lock()
	if g.writing < g.writers {
		g.writing++
		g.mu.Unlock()
		l.writeAndHandOff(ctx, []*groupedEvent{me})
		return me.res, me.err
	}
	g.queue = append(g.queue, me)
	g.mu.Unlock()

	// Not canceled while queued or written: once queued, the event is
	// written with its group (a client that went away finds it stored when
	// it posts it again, a replay), and every queued call is answered as
	// soon as its group is.
	<-me.wake
	if me.lead != nil {
		l.writeAndHandOff(ctx, me.lead)
	}
	return me.res, me.err
}

// writeAndHandOff writes group, answers its calls, and then hands the
// writer's place to the first queued call with the queue as its group, or
// gives the place back. It does so even when writing panics (the panic
// goes on to the writing call's request): the other calls of the group are
// answered with an error, and the place is never lost.
func (l *Ledger) writeAndHandOff(ctx context.Context, group []*groupedEvent) {
	defer l.handOff(group)
	l.writeGroup(context.WithoutCancel(ctx), group)
}

// errGroupFailed answers the calls of a group whose writer panicked.
var errGroupFailed = errors.New("error recording a group of usage events: its writer failed; nothing of the group is acknowledged")

func (l *Ledger) handOff(group []*groupedEvent) {
	for _, ge := range group {
		if ge.res == nil && ge.err == nil {
			ge.err = errGroupFailed
		}
	}
	g := &l.groups
	g.mu.Lock()
	var next []*groupedEvent
	if len(g.queue) > 0 {
		n := min(len(g.queue), g.max)
		next = make([]*groupedEvent, n)
		copy(next, g.queue)
		g.queue = append(g.queue[:0], g.queue[n:]...)
	} else {
		g.writing--
	}
	g.mu.Unlock()
	for _, ge := range group[1:] { // group[0] wrote it: a caller that found a writer free, or one woken to lead
		close(ge.wake)
	}
	if next != nil {
		next[0].lead = next
		close(next[0].wake)
	}
}

// groupWriteTimeout bounds the writing of one group, which no single
// caller can cancel.
const groupWriteTimeout = time.Minute

// writeGroup records the events of group, setting each call's answer:
//  1. one statement, its own transaction, inserts every event that is new
//     and whose period exists, is open and takes it (usageEventInsertOpen,
//     usageEventsInsertOpen);
//  2. the others — a period's first event, a replay, a conflict, a refusal
//     — take the batch path in one transaction (recordEach), which answers
//     each of them.
func (l *Ledger) writeGroup(ctx context.Context, group []*groupedEvent) {
	ctx, cancel := context.WithTimeout(ctx, groupWriteTimeout)
	defer cancel()
	if l.config.OnIngestGroup != nil {
		l.config.OnIngestGroup(len(group))
	}
	now := l.now()
	events := eventsOf(group)
	var inserted map[eventKey]*UsageEvent
	var err error
	if len(events) == 1 {
		var e *UsageEvent
		if e, err = usageEventInsertOpen(ctx, l.pool, now, events[0]); e != nil {
			inserted = map[eventKey]*UsageEvent{{e.CustomerID, e.EventID}: e}
		}
	} else {
		inserted, err = usageEventsInsertOpen(ctx, l.pool, usageEventsInsertOpenCall, now, events)
	}
	if err != nil && !isRetryable(err) {
		for _, ge := range group {
			ge.err = err
		}
		return
	}
	var rest []*groupedEvent
	for _, ge := range group {
		k := eventKey{ge.ev.CustomerID, ge.ev.EventID}
		if e, ok := inserted[k]; ok {
			ge.res = &UsageEventResult{Event: e}
			delete(inserted, k) // a later call with the same key conflicted with it
			continue
		}
		rest = append(rest, ge)
	}
	if len(rest) == 0 {
		return
	}
	results, errs := l.recordEach(ctx, eventsOf(rest))
	for i, ge := range rest {
		ge.res, ge.err = results[i], errs[i]
	}
}

// eventsOf returns the events of group's calls.
func eventsOf(group []*groupedEvent) []*preparedEvent {
	events := make([]*preparedEvent, len(group))
	for i, ge := range group {
		events[i] = ge.ev
	}
	return events
}

// recordEach records events, each on its own account, in one transaction of
// the batch path (recordTx), and returns each event's result or error by
// index. An event refused (a conflict, a closed period, an unpriced metric,
// a currency or customer that does not fit) is taken out and the
// transaction run again without it, so a refused event never leaves a trace
// (not even the period it would have opened); its answer stands once the
// others committed. When the transaction fails, every event gets its error:
// none is acknowledged.
func (l *Ledger) recordEach(ctx context.Context, events []*preparedEvent) ([]*UsageEventResult, []error) {
	results := make([]*UsageEventResult, len(events))
	errs := make([]error, len(events))
	live := make([]*preparedEvent, len(events))
	for i, ev := range events {
		ev.index = i
		live[i] = ev
	}
	for len(live) > 0 {
		now := l.now()
		var refused map[int]error
		err := l.withTx(ctx, func(tx *Tx) error {
			found, itemErrs, err := l.recordTx(ctx, tx, now, len(events), live, false)
			if err != nil {
				return err
			}
			if len(itemErrs) > 0 {
				refused = itemErrs
				return errRollback
			}
			for _, ev := range live {
				results[ev.index] = found[ev.index]
			}
			return nil
		})
		if errors.Is(err, errRollback) {
			kept := live[:0]
			for _, ev := range live {
				if e, ok := refused[ev.index]; ok {
					errs[ev.index] = e
					continue
				}
				kept = append(kept, ev)
			}
			live = kept
			continue
		}
		if err != nil {
			err = fmt.Errorf("error recording %d usage events: %w", len(live), err)
			for i := range events {
				results[i], errs[i] = nil, err
			}
		}
		break
	}
	return results, errs
}
