package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// statementCounter is a pgx tracer that counts the round trips to Postgres:
// each statement sent alone, each batch of statements sent together.
type statementCounter struct {
	n    atomic.Int64
	mu   sync.Mutex
	sqls []string // the statements since the last reset, for messages
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.mu.Lock()
	c.sqls = append(c.sqls, strings.Join(strings.Fields(data.SQL), " "))
	c.mu.Unlock()
	return ctx
}

// reset zeroes the count and forgets the statements.
func (c *statementCounter) reset() {
	c.n.Store(0)
	c.mu.Lock()
	c.sqls = nil
	c.mu.Unlock()
}

// String lists the statements since the last reset, one per line.
func (c *statementCounter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, q := range c.sqls {
		fmt.Fprintf(&b, "\n  %.100s", q)
	}
	return b.String()
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a batch as one round trip: its statements go
// together (a ledger transaction sends its queued statements and its BEGIN
// with the next statement).
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	sqls := make([]string, len(data.Batch.QueuedQueries))
	for i, q := range data.Batch.QueuedQueries {
		sqls[i] = strings.Join(strings.Fields(q.SQL), " ")
	}
	c.mu.Lock()
	c.sqls = append(c.sqls, strings.Join(sqls, " + "))
	c.mu.Unlock()
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// countingLedger returns a ledger of config on b's database, with b's clock,
// whose pool counts every statement it sends.
func countingLedger(t *testing.T, b *testBundle, config ledger.Config) (*ledger.Ledger, *statementCounter) {
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
	config.Clock, config.Scheduler, config.Logger = b.Clock.Now, jobs.Scheduler{Client: client}, b.Logger
	l, err := ledger.New(pool, config)
	require.NoError(t, err)
	return l, counter
}

// The hot path of ingest is one statement per event, and a batch costs the
// same handful of statements whatever its size; the rare cases (first event
// of a period, replays) may take more.
func TestUsageEventRoundTrips(t *testing.T) {
	ctx, b := setup(t, setupOpts{})
	l, counter := countingLedger(t, b, ledger.Config{})

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
		counter.reset()
		results, err := l.UsageEventRecordBatch(ctx, batch("b"))
		require.NoError(t, err)
		require.Len(t, results, 200)
		// begin, find stored, lock periods, insert, commit (each at most one round trip)
		require.LessOrEqual(t, counter.n.Load(), int64(5), "statements for a batch of 200 in open periods")
		require.Equal(t, int64(400), b.Count(t, `SELECT count(*) FROM billing.usage_events WHERE customer_id LIKE 'batch-%'`))
	})

	t.Run("OneEventOneStatement", func(t *testing.T) {
		_, err := l.UsageEventRecord(ctx, event("first", 100)) // creates the period
		require.NoError(t, err)
		counter.reset()
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

	t.Run("OneQuantityEventOneStatement", func(t *testing.T) {
		_, _, err := b.putPlan(ctx, t, "std", planAPICalls)
		require.NoError(t, err)
		_, _, err = b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "metered", StripeCustomerID: "cus_m", Currency: "usd", PlanID: ptr("std")})
		require.NoError(t, err)
		metered := func(id string) ledger.UsageEventParams {
			return ledger.UsageEventParams{CustomerID: "metered", EventID: id, Metric: "api_calls", Quantity: "2.5"}
		}
		_, err = l.UsageEventRecord(ctx, metered("first")) // creates the period
		require.NoError(t, err)
		counter.reset()
		res, err := l.UsageEventRecord(ctx, metered("second"))
		require.NoError(t, err)
		require.False(t, res.Replay)
		require.Equal(t, "2.5", res.Event.Quantity.Text('f'))
		require.Equal(t, int64(1), counter.n.Load(), "statements for a new quantity event in an open period:%s", counter)
	})
}

// A charge's first claim and the step after a look-up that found nothing
// cost a fixed, small number of round trips.
func TestChargeClaimRoundTrips(t *testing.T) {
	config := ledger.Config{AnomalyFactor: ledger.AnomalyFactorDefault}
	ctx, b, _ := guardBundle(t, config)
	c := closedWith(t, ctx, b, "acme", 1000)
	l, counter := countingLedger(t, b, config)

	claim, err := l.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
	require.NoError(t, err)
	require.True(t, claim.Lookup)
	require.True(t, claim.Charge.BudgetReserved, "the lease's update reserves the amount")
	// begin with the charge FOR UPDATE, the customer's history and cap with
	// the kill switch, the lease (and the reservation), commit
	require.Equal(t, int64(4), counter.n.Load(), "round trips of a first claim:%s", counter)

	counter.reset()
	next, err := l.ChargeLookupNone(ctx, claim, "job:1/1")
	require.NoError(t, err)
	require.NotNil(t, next.Charge.GenerationFirstAttemptedAt)
	require.NotZero(t, next.AttemptID)
	// begin with the key and its first use, the attempt row, commit
	require.Equal(t, int64(3), counter.n.Load(), "round trips after a look-up that found nothing:%s", counter)

	// A look-up before the claim that found nothing makes the claim mark
	// the key's first use: no transaction after it.
	lookedUp := closedWith(t, ctx, b, "beta", 1000)
	target := lookedUp.LookupTarget()
	counter.reset()
	claim, err = l.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: lookedUp.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 2, JobAttempt: 1,
		LookedUp: &target})
	require.NoError(t, err)
	require.False(t, claim.Lookup)
	require.NotNil(t, claim.Charge.GenerationFirstAttemptedAt)
	// the first claim's, and the attempt row (sent before the commit: nothing
	// came after it here; a worker's close reads the webhook endpoints then)
	require.Equal(t, int64(5), counter.n.Load(), "round trips of a first claim after a look-up:%s", counter)
}

// A transaction's first notice sends the read of the webhook endpoints
// with the statement after it: recording an outcome whose caller completes
// its job in the same transaction costs no round trip for them, and what
// the read found decides the notifications as before.
func TestNoticeReadsEndpointsAhead(t *testing.T) {
	config := ledger.Config{AnomalyFactor: ledger.AnomalyFactorDefault}
	ctx, b, _ := guardBundle(t, config)
	l, counter := countingLedger(t, b, config)
	record := func(customer string) {
		t.Helper()
		c := closedWith(t, ctx, b, customer, 1000)
		claim, err := l.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
		require.NoError(t, err)
		claim, err = l.ChargeLookupNone(ctx, claim, "job:1/1")
		require.NoError(t, err)
		counter.reset()
		_, err = l.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_" + customer}, "job:1/1",
			func(ctx context.Context, tx *ledger.Tx) error {
				var one int
				return tx.QueryRow(ctx, `SELECT 1`).Scan(&one) // as a job's completion
			})
		require.NoError(t, err)
	}

	record("acme")
	// begin with the charge FOR UPDATE; the attempt's result with the
	// charge's update; the transition and the endpoints with the caller's
	// statement; the statement's number, taken last (the counter row every
	// settling charge waits for is held for the commit alone); commit
	require.Equal(t, int64(5), counter.n.Load(), "round trips of an outcome's record:%s", counter)
	require.Empty(t, b.notifications(t, ctx))

	endpoint := b.subscribe(t, ctx, ledger.NotifyChargeSucceeded)
	record("beta")
	require.Equal(t, []string{ledger.NotifyChargeSucceeded}, b.notifications(t, ctx))
	require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.webhook_deliveries WHERE endpoint_id = $1`, endpoint))
}

// A batch answers each created event exactly as it was stored: a replay of
// the batch, read back from Postgres, answers the same events.
func TestUsageEventBatchAnswersAsStored(t *testing.T) {
	ctx, b := setup(t, setupOpts{})
	b.Plan(t, "std", planAPICalls)
	_, err := b.onPlan(ctx, "acme", ptr("std"))
	require.NoError(t, err)
	occurred := ledgertest.ClockStart.Add(-time.Hour + 123456789*time.Nanosecond)
	batch := []ledger.UsageEventParams{
		{CustomerID: "acme", EventID: "a", Metric: "api_calls", Quantity: "7.50",
			Properties: []byte(`{"z": 1, "a": [true, null, "x"], "n": 1.50}`), OccurredAt: &occurred},
		{CustomerID: "acme", EventID: "b", AmountCents: 200, Currency: "USD"},
		{CustomerID: "acme", EventID: "a", Metric: "api_calls", Quantity: "7.5",
			Properties: []byte(`{"z": 1, "a": [true, null, "x"], "n": 1.50}`), OccurredAt: &occurred},
	}
	created, err := b.Ledger.UsageEventRecordBatch(ctx, batch)
	require.NoError(t, err)
	require.Equal(t, "7.5", created[0].Event.Quantity.Text('f'))
	require.False(t, created[0].Replay)
	require.True(t, created[2].Replay, "the in-batch duplicate")
	replayed, err := b.Ledger.UsageEventRecordBatch(ctx, batch)
	require.NoError(t, err)
	for i := range batch {
		require.True(t, replayed[i].Replay)
		require.Equal(t, replayed[i].Event, created[i].Event, "event %d as answered when created and as stored", i)
	}
}
