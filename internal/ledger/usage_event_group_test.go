package ledger_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// groupSizes records the groups a ledger wrote (Config.OnIngestGroup).
type groupSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (g *groupSizes) observe(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sizes = append(g.sizes, n)
}

func (g *groupSizes) get() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.sizes)
}

// lockPeriod holds customer's period FOR UPDATE, as a close does, in a
// transaction of its own connection until the returned release is called.
func lockPeriod(t *testing.T, b *testBundle, customer string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM billing.periods WHERE customer_id = $1 FOR UPDATE`, customer)
	require.NoError(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Rollback(ctx)
			_ = conn.Close(ctx)
		})
	}
	t.Cleanup(release)
	return release
}

// openBlocker opens the periods of acme and of customer "blocker", whose
// period a test then locks, one event each.
func openBlocker(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	b.Customer(t, "blocker")
	_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "blocker", EventID: "open", AmountCents: 1})
	require.NoError(t, err)
	_, err = b.Ledger.UsageEventRecord(ctx, event("open", 1))
	require.NoError(t, err)
}

// lockWaiter waits until a backend other than those in not waits for a
// lock, and returns its pid.
func lockWaiter(t *testing.T, b *testBundle, not ...int32) int32 {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var pids []int32
		rows, err := b.Pool.Query(context.Background(), `
SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
		require.NoError(t, err)
		pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		for _, pid := range pids {
			if !slices.Contains(not, pid) {
				return pid
			}
		}
	}
	t.Fatal("no backend waits for a lock")
	return 0
}

// waitQueued waits until n single events wait for a writer.
func waitQueued(t *testing.T, b *testBundle, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return b.Ledger.IngestQueued() == n }, 30*time.Second, time.Millisecond,
		"queued: %d, want %d", b.Ledger.IngestQueued(), n)
}

type answer struct {
	res *ledger.UsageEventResult
	err error
}

// recordAsync records p in a goroutine; the answer arrives on the channel.
func recordAsync(b *testBundle, p ledger.UsageEventParams) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		res, err := b.Ledger.UsageEventRecord(context.Background(), p)
		ch <- answer{res, err}
	}()
	return ch
}

// Concurrent single events share one statement and commit, and each gets
// its own answer: a replay, a conflict or a refusal is that event's alone,
// and a refused event leaves nothing behind, not even the period it would
// have opened.
func TestIngestGroupAnswersEachEvent(t *testing.T) {
	t.Parallel()
	groups := &groupSizes{}
	ctx, b := setup(t, setupOpts{ledger: ledger.Config{IngestWriters: 1, OnIngestGroup: groups.observe}})
	for _, c := range []string{"blocker", "fresh", "fresh2"} {
		b.Customer(t, c)
	}
	stored, err := b.Ledger.UsageEventRecord(ctx, event("stored", 100))
	require.NoError(t, err)
	_, err = b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "blocker", EventID: "b0", AmountCents: 1})
	require.NoError(t, err)
	periodsBefore := b.periodCount(t)

	// The one writer is busy with an event whose period a close holds: the
	// events that follow queue behind it and are written together.
	release := lockPeriod(t, b, "blocker")
	first := recordAsync(b, ledger.UsageEventParams{CustomerID: "blocker", EventID: "b1", AmountCents: 1})
	lockWaiter(t, b)
	fresh := ledger.UsageEventParams{CustomerID: "fresh", EventID: "f1", AmountCents: 7}
	unpricedNew := ledger.UsageEventParams{CustomerID: "fresh2", EventID: "u1", Metric: "api_calls", Quantity: "3"}
	calls := map[string]ledger.UsageEventParams{
		"new":           event("new", 100),
		"replay":        event("stored", 100),
		"conflict":      event("stored", 999),
		"dup-a":         event("dup", 50),
		"dup-b":         event("dup", 50),
		"fresh":         fresh,
		"unpriced":      {CustomerID: "acme", EventID: "u0", Metric: "api_calls", Quantity: "3"},
		"unpriced-new":  unpricedNew,
		"currency":      {CustomerID: "acme", EventID: "c0", AmountCents: 5, Currency: "eur"},
		"no-customer":   {CustomerID: "nobody", EventID: "n0", AmountCents: 5},
		"after-blocker": {CustomerID: "blocker", EventID: "b2", AmountCents: 1},
	}
	answers := map[string]<-chan answer{}
	for name, p := range calls {
		answers[name] = recordAsync(b, p)
	}
	waitQueued(t, b, len(calls))
	release()
	require.NoError(t, (<-first).err)
	got := map[string]answer{}
	for name, ch := range answers {
		got[name] = <-ch
	}
	require.Equal(t, []int{1, 1, 1, len(calls)}, groups.get(), "the queued events were written as one group")

	require.NoError(t, got["new"].err)
	require.False(t, got["new"].res.Replay)
	require.NoError(t, got["replay"].err)
	require.True(t, got["replay"].res.Replay)
	require.Equal(t, stored.Event.ID, got["replay"].res.Event.ID)
	requireConflict(t, got["conflict"].err, ledger.ConflictIdempotency)
	require.NoError(t, got["dup-a"].err)
	require.NoError(t, got["dup-b"].err)
	require.Equal(t, got["dup-a"].res.Event.ID, got["dup-b"].res.Event.ID, "one event, stored once")
	require.NotEqual(t, got["dup-a"].res.Replay, got["dup-b"].res.Replay, "one created, the other its replay")
	require.NoError(t, got["fresh"].err)
	require.Equal(t, "usd", got["fresh"].res.Event.Currency)
	var unpriced *ledger.UnpricedMetricError
	require.ErrorAs(t, got["unpriced"].err, &unpriced)
	require.ErrorAs(t, got["unpriced-new"].err, &unpriced)
	requireInvalid(t, got["currency"].err, "currency")
	require.Error(t, got["no-customer"].err)
	require.NoError(t, got["after-blocker"].err)

	// Stored: b0, b1, b2, stored, new, dup, f1; the refusals left nothing,
	// and only fresh's period was opened.
	require.Equal(t, int64(7), b.eventCount(t))
	require.Equal(t, periodsBefore+1, b.periodCount(t))
	require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.periods WHERE customer_id IN ('fresh2', 'nobody')`))
}

// A group whose connection dies mid-statement fails every call in it:
// none is acknowledged, none is stored; the calls of the groups before and
// after it are acknowledged and stored. Every acknowledged event is in the
// ledger, every event answered with an error is not.
func TestIngestGroupKilled(t *testing.T) {
	t.Parallel()
	groups := &groupSizes{}
	ctx, b := setup(t, setupOpts{ledger: ledger.Config{IngestWriters: 1, OnIngestGroup: groups.observe}})
	openBlocker(t, b)

	release := lockPeriod(t, b, "blocker")
	all := map[string]<-chan answer{}
	all["alone"] = recordAsync(b, ledger.UsageEventParams{CustomerID: "blocker", EventID: "alone", AmountCents: 1})
	alone := lockWaiter(t, b)
	const doomed, after = 10, 5
	for i := range doomed {
		id := fmt.Sprintf("doomed-%d", i)
		p := event(id, 10)
		if i%2 == 0 { // the group waits for the close's lock whatever its order
			p = ledger.UsageEventParams{CustomerID: "blocker", EventID: id, AmountCents: 10}
		}
		all[id] = recordAsync(b, p)
	}
	waitQueued(t, b, doomed)

	// The lone writer's connection dies: its call fails, and the queued
	// group is written next — and waits for the lock in turn.
	var killed bool
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, alone).Scan(&killed))
	require.True(t, killed)
	group := lockWaiter(t, b, alone)
	for i := range after {
		id := fmt.Sprintf("after-%d", i)
		all[id] = recordAsync(b, event(id, 20))
	}
	waitQueued(t, b, after)
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, group).Scan(&killed))
	require.True(t, killed)

	got := map[string]answer{}
	for id, ch := range all {
		got[id] = <-ch
	}
	release()
	require.Equal(t, []int{1, 1, 1, doomed, after}, groups.get())

	for id, a := range got {
		var stored int64
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM billing.usage_events WHERE event_id = $1`, id).Scan(&stored))
		switch {
		case id == "alone" || len(id) > 6 && id[:6] == "doomed":
			require.Error(t, a.err, "%s: its connection was killed", id)
			require.Zero(t, stored, "%s: answered with an error, must not be stored", id)
		default:
			require.NoError(t, a.err, id)
			require.Equal(t, int64(1), stored, "%s: acknowledged, must be stored", id)
		}
	}

	// Posted again, a failed event is new (created, not a replay).
	res, err := b.Ledger.UsageEventRecord(ctx, event("doomed-1", 10))
	require.NoError(t, err)
	require.False(t, res.Replay)
}

// A writer that panics mid-group answers the rest of its group with an
// error (none acknowledged, none stored) and gives its place on: the
// events after it are written.
func TestIngestGroupWriterPanics(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	panicking := func(n int) {
		if calls.Add(1) == 4 { // the fourth group: the one queued behind the blocked writer
			panic("injected")
		}
	}
	ctx, b := setup(t, setupOpts{ledger: ledger.Config{IngestWriters: 1, OnIngestGroup: panicking}})
	openBlocker(t, b)

	release := lockPeriod(t, b, "blocker")
	first := recordAsync(b, ledger.UsageEventParams{CustomerID: "blocker", EventID: "first", AmountCents: 1})
	lockWaiter(t, b)
	doomed := map[string]<-chan answer{}
	panicked := make(chan any, 1)
	for i := range 5 {
		id := fmt.Sprintf("doomed-%d", i)
		p := event(id, 10)
		ch := make(chan answer, 1)
		go func() {
			defer func() {
				if r := recover(); r != nil {
					panicked <- r
					ch <- answer{err: fmt.Errorf("panicked: %v", r)}
				}
			}()
			res, err := b.Ledger.UsageEventRecord(context.Background(), p)
			ch <- answer{res, err}
		}()
		doomed[id] = ch
	}
	waitQueued(t, b, 5)
	release()
	require.NoError(t, (<-first).err)
	require.Equal(t, "injected", <-panicked, "the group's writer panicked")
	for id, ch := range doomed {
		var a answer
		select {
		case a = <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: never answered after its group's writer panicked", id)
		}
		require.Error(t, a.err, id)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.usage_events WHERE event_id = $1`, id), id)
	}

	// The writer's place was given back: events are written again.
	res, err := b.Ledger.UsageEventRecord(ctx, event("after", 10))
	require.NoError(t, err)
	require.False(t, res.Replay)
}
