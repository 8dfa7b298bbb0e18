package bench

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/tally-billing/tally/internal/schema"
)

// rawSchema holds the baselines' copies of Tally's tables: the same
// columns, defaults, checks and indexes, none of the foreign keys or
// triggers (CREATE TABLE … LIKE … INCLUDING ALL copies neither).
const rawSchema = `
CREATE SCHEMA bench_raw;
CREATE TABLE bench_raw.usage_events (LIKE billing.usage_events INCLUDING ALL);
CREATE TABLE bench_raw.river_job (LIKE river.river_job INCLUDING ALL);`

// rawEventInsert is the event half of a raw_sql transaction, shaped like
// Tally's insert (internal/ledger/usage_event.go): ON CONFLICT on (customer,
// event_id), returning the row's id.
const rawEventInsert = `
INSERT INTO bench_raw.usage_events (customer_id, event_id, period, amount_cents, currency,
                                    occurred_at, received_at, payload_hash)
VALUES ($1, $2, $3, $4, 'usd', $5, $5, $6)
ON CONFLICT (customer_id, event_id) DO NOTHING
RETURNING id`

// rawJobInsert is the outbox half: a river_job row shaped like Tally's
// charge job (kind, queue, args, scheduled in the future, unique by a key
// with River's default unique states), so it enters the same indexes.
const rawJobInsert = `
INSERT INTO bench_raw.river_job (args, kind, max_attempts, priority, queue, state, scheduled_at, unique_key, unique_states)
VALUES ($1, 'charge_period', 25, 1, 'charges', 'scheduled', $2, $3, B'11110101')`

// baseDatabase creates, once, the baselines' database with the bench_raw
// tables, and returns its URL.
func (r *run) baseDatabase(ctx context.Context) (string, error) {
	if r.baseURL != "" {
		return r.baseURL, nil
	}
	dbURL, err := r.createDatabase(ctx, "base")
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", fmt.Errorf("error connecting to the baseline database: %w", err)
	}
	_, err = conn.Exec(ctx, rawSchema)
	_ = conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return "", fmt.Errorf("error creating the bench_raw tables: %w", err)
	}
	r.baseURL = dbURL
	return dbURL, nil
}

// connectEach opens n connections to dbURL; close them with closeAll.
func connectEach(ctx context.Context, dbURL string, n int) ([]*pgx.Conn, error) {
	conns := make([]*pgx.Conn, 0, n)
	for range n {
		c, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("error connecting to the baseline database: %w", err)
		}
		conns = append(conns, c)
	}
	return conns, nil
}

func closeAll(conns []*pgx.Conn) {
	for _, c := range conns {
		_ = c.Close(context.Background())
	}
}

// clientRands returns one random source per client, each used only by its
// client's goroutine.
func clientRands(n int, stream uint64) []*rand.Rand {
	rnds := make([]*rand.Rand, n)
	for i := range rnds {
		rnds[i] = rand.New(rand.NewPCG(uint64(i), stream))
	}
	return rnds
}

// customerIDs returns the ids of n customers: cust-0000, cust-0001, …
func customerIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("cust-%04d", i)
	}
	return ids
}

// Notes of the raw phases.
const (
	rawSQLNote          = "1 event + 1 outbox row per transaction: BEGIN, 2 INSERTs, COMMIT"
	rawSQLPipelinedNote = "1 event + 1 outbox row per transaction, pipelined in one round trip"
)

// rawSQLWindow is one window of raw_sql: a client per connection of conns,
// each transaction one event row and one outbox row, events spread over
// the customers, their ids starting with prefix. The transaction is BEGIN,
// two INSERTs and COMMIT (the baseline issue 11 measured), or, pipelined
// (raw_sql_pipelined), the two INSERTs sent as one pgx.Batch: one round
// trip, one implicit transaction.
func (r *run) rawSQLWindow(ctx context.Context, conns []*pgx.Conn, pipelined bool, prefix string) loopResult {
	customers := customerIDs(r.cfg.Customers)
	rnds := clientRands(len(conns), 1)
	period := time.Now().UTC().Format("2006-01")
	return closedLoop(ctx, len(conns), r.cfg.Duration, 0, func(ctx context.Context, c, seq int) (int, error) {
		customer := customers[rnds[c].IntN(len(customers))]
		eventID := prefix + "-" + strconv.Itoa(c) + "-" + strconv.Itoa(seq)
		hash := sha256.Sum256([]byte(customer + "/" + eventID))
		now := time.Now()
		amount, args := 1+rnds[c].Int64N(1000), `{"customer_id":"`+customer+`","period":"`+period+`"}`
		if !pipelined {
			return 1, pgx.BeginFunc(ctx, conns[c], func(tx pgx.Tx) error {
				var id int64
				if err := tx.QueryRow(ctx, rawEventInsert, customer, eventID, period, amount, now, hash[:]).Scan(&id); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, rawJobInsert, args, now.Add(time.Hour), hash[:])
				return err
			})
		}
		b := &pgx.Batch{}
		b.Queue(rawEventInsert, customer, eventID, period, amount, now, hash[:])
		b.Queue(rawJobInsert, args, now.Add(time.Hour), hash[:])
		br := conns[c].SendBatch(ctx, b)
		var id int64
		err := br.QueryRow().Scan(&id)
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return 1, err
	})
}

// rawCopyWindow is one window of raw_copy: a writer per connection of
// conns, each transaction a CopyFrom of batchSize event rows, their ids
// starting with prefix.
func (r *run) rawCopyWindow(ctx context.Context, conns []*pgx.Conn, prefix string) loopResult {
	customers := customerIDs(r.cfg.Customers)
	rnds := clientRands(len(conns), 2)
	period := time.Now().UTC().Format("2006-01")
	columns := []string{"customer_id", "event_id", "period", "amount_cents", "currency", "occurred_at", "received_at", "payload_hash"}
	rows := make([][][]any, len(conns)) // each writer's rows, reused
	for i := range rows {
		rows[i] = make([][]any, batchSize)
	}
	return closedLoop(ctx, len(conns), r.cfg.Duration, 0, func(ctx context.Context, c, seq int) (int, error) {
		now := time.Now()
		for i := range rows[c] {
			customer := customers[rnds[c].IntN(len(customers))]
			eventID := prefix + "-" + strconv.Itoa(c) + "-" + strconv.Itoa(seq) + "-" + strconv.Itoa(i)
			hash := sha256.Sum256([]byte(customer + "/" + eventID))
			rows[c][i] = []any{customer, eventID, period, 1 + rnds[c].Int64N(1000), "usd", now, now, hash[:]}
		}
		n, err := conns[c].CopyFrom(ctx, pgx.Identifier{"bench_raw", "usage_events"}, columns, pgx.CopyFromRows(rows[c]))
		return int(n), err
	})
}

// noopQueue is river_noop's own queue.
const noopQueue = "bench_noop"

// noopArgs are the args of river_noop's jobs.
type noopArgs struct {
	N int `json:"n"`
}

func (noopArgs) Kind() string { return "bench_noop" }

func (noopArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: noopQueue} }

// noopWorker completes every job at once.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// riverPoolConns is the River baseline's pool size: the server's worker
// pool (workerDBMaxConnsDefault in cmd/server/config.go).
const riverPoolConns = 10

// riverNoop is the river_noop phase: Charges jobs inserted in one InsertMany
// transaction, then an in-process River client with Workers workers started;
// timed from the start until the last job's completion is stored.
func (r *run) riverNoop(ctx context.Context, dbURL string) (*Result, error) {
	n := r.cfg.Charges
	r.logf("%s: %d jobs, %d workers", PhaseRiverNoop, n, r.cfg.Workers)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("error parsing the baseline database URL: %w", err)
	}
	cfg.MaxConns = riverPoolConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("error connecting to the baseline database: %w", err)
	}
	defer pool.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:  slog.New(slog.DiscardHandler),
		Schema:  schema.RiverSchema,
		Queues:  map[string]river.QueueConfig{noopQueue: {MaxWorkers: r.cfg.Workers}},
		Workers: workers,
	})
	if err != nil {
		return nil, fmt.Errorf("error creating the River client: %w", err)
	}
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: noopArgs{N: i}}
	}
	if _, err := client.InsertMany(ctx, params); err != nil {
		return nil, fmt.Errorf("error inserting %d no-op jobs: %w", n, err)
	}
	completed, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: n + 1000, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer unsubscribe()

	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return nil, fmt.Errorf("error starting the River client: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()
	timeout := time.After(2*time.Minute + time.Duration(n)*10*time.Millisecond)
	done := 0
	for done < n {
		select {
		case ev := <-completed:
			if ev.Job != nil && ev.Job.Kind == (noopArgs{}).Kind() {
				done++
			}
		case <-timeout:
			return nil, &phaseError{phase: PhaseRiverNoop, err: fmt.Errorf("only %d of %d jobs completed in time", done, n)}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &Result{Phase: PhaseRiverNoop, Unit: "jobs/s", Count: int64(n), Elapsed: time.Since(start),
		Note: fmt.Sprintf("%d workers, a %d-connection pool, timed from Start", r.cfg.Workers, riverPoolConns)}, nil
}
