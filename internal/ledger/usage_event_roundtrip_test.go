package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/ledgertest"
)

// statementCounter is a pgx tracer that counts the statements sent.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countingLedger returns a ledger on b's database whose pool counts every
// statement it sends.
func countingLedger(t *testing.T, b *ledgertest.Bundle) (*ledger.Ledger, *statementCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.URL)
	require.NoError(t, err)
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	client, err := jobs.NewInsertClient(pool, b.Logger)
	require.NoError(t, err)
	l, err := ledger.New(pool, ledger.Config{Clock: b.Clock.Now, Scheduler: jobs.Scheduler{Client: client}, Logger: b.Logger})
	require.NoError(t, err)
	return l, counter
}

// The hot path of ingest is one statement per event, and a batch costs the
// same handful of statements whatever its size; the rare cases (first event
// of a period, replays) may take more.
func TestUsageEventRoundTrips(t *testing.T) {
	ctx, b := setup(t)
	l, counter := countingLedger(t, b.Bundle)

	t.Run("OneEventOneStatement", func(t *testing.T) {
		_, err := l.UsageEventRecord(ctx, event("first", 100)) // creates the period
		require.NoError(t, err)
		counter.n.Store(0)
		res, err := l.UsageEventRecord(ctx, event("second", 250))
		require.NoError(t, err)
		require.False(t, res.Replay)
		require.Equal(t, int64(250), res.Event.AmountCents)
		require.Equal(t, "usd", res.Event.Currency)
		require.Equal(t, int64(1), counter.n.Load(), "statements for a new event in an open period")

		replay, err := l.UsageEventRecord(ctx, event("second", 250))
		require.NoError(t, err)
		require.True(t, replay.Replay)
		require.Equal(t, res.Event, replay.Event, "a replay answers the event as first stored")
	})

	t.Run("BatchStatementsDoNotGrowWithSize", func(t *testing.T) {
		for i := range 10 {
			b.Customer(t, fmt.Sprintf("batch-%02d", i))
		}
		batch := func(prefix string) []ledger.UsageEventParams {
			var events []ledger.UsageEventParams
			for i := range 200 {
				events = append(events, ledger.UsageEventParams{
					CustomerID: fmt.Sprintf("batch-%02d", i%10), EventID: fmt.Sprintf("%s-%d", prefix, i), AmountCents: 10})
			}
			return events
		}
		_, err := l.UsageEventRecordBatch(ctx, batch("a")) // creates the ten periods
		require.NoError(t, err)
		counter.n.Store(0)
		results, err := l.UsageEventRecordBatch(ctx, batch("b"))
		require.NoError(t, err)
		require.Len(t, results, 200)
		// begin, find stored, lock periods, insert, commit
		require.LessOrEqual(t, counter.n.Load(), int64(5), "statements for a batch of 200 in open periods")
		require.Equal(t, int64(400), b.Count(t, `SELECT count(*) FROM billing.usage_events WHERE customer_id LIKE 'batch-%'`))
	})
}
