package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Every transaction the ledger runs is a Tx (withTx), and every function
// that works in one takes a *Tx. A Tx saves round trips to Postgres, which
// are most of what a charge costs on a busy machine (docs/benchmarks.md):
//
//   - it begins lazily: BEGIN is sent with its first statement, in one round
//     trip (pgx.Batch.BeginTx), and a transaction that sends nothing sends no
//     BEGIN either;
//   - a statement whose result nothing needs before the next statement is
//     queued (execLater, queryLater, queryRowLater) and sent with that next
//     statement, in the same round trip, at the latest before the
//     transaction commits. A queued read is a later: its get sends it, with
//     whatever else is queued, if it has not gone yet, so the code reads as
//     if every statement ran where it is written.
//
// Statements still run one after the other, in the order they were issued,
// in the one transaction: what a statement sees is what it would see sent
// alone. A queued statement that fails fails the statement it was sent with
// (its error, not that statement's, is returned), and so the transaction; a
// queued read that finds no row is an error of its own, never that
// statement's pgx.ErrNoRows.
//
// A Tx also records, for after its commit, the charge transitions logged in
// it (reported to Config.OnChargeTransition) and the changes its
// notifications report (notices, written by notifyTx before the commit). A
// savepoint begun in it (savepoint, Begin) is a Tx too, whose records join
// its parent's when it is released and vanish with it when it is rolled
// back.
type Tx struct {
	pg pgx.Tx // nil until the transaction begins

	// pool is where a transaction withTx opened begins; nil for a
	// savepoint.
	pool *pgxpool.Pool

	// pending are the statements queued for the next round trip.
	pending *pgx.Batch
	// atCommit are the statements queued for the commit's round trip
	// (execAtCommit), sent after everything else.
	atCommit []*pgx.QueuedQuery

	parent      *Tx
	transitions [][2]string // (from, to); from is "" for a charge's creation
	notices     []notice
	subs        *later[[]subscription] // queued with the first notice (recordNotice)
}

var _ pgx.Tx = (*Tx)(nil) // River completes a job in it

// txAttemptsMax bounds the retries of a transaction that Postgres aborted
// for a deadlock or a serialization failure.
const txAttemptsMax = 5

// withTx runs fn in a transaction and commits it, retrying the whole
// transaction when Postgres aborts it with a deadlock or serialization
// failure. fn must be safe to run again from the start.
//
// The charge transitions fn logs (transitionTx) are reported to
// Config.OnChargeTransition once the transaction has committed, never for
// one rolled back; the notifications of what fn changed (notification.go)
// are written in the transaction, before it commits.
func (l *Ledger) withTx(ctx context.Context, fn func(tx *Tx) error) error {
	var err error
	for attempt := 1; attempt <= txAttemptsMax; attempt++ {
		tx := &Tx{pool: l.pool}
		err = tx.run(ctx, func() error {
			if err := fn(tx); err != nil {
				return err
			}
			return l.notifyTx(ctx, tx, l.now())
		})
		if err == nil && l.config.OnChargeTransition != nil {
			for _, t := range tx.transitions {
				l.config.OnChargeTransition(t[0], t[1])
			}
		}
		if !isRetryable(err) {
			return err
		}
		l.logger.WarnContext(ctx, "retrying transaction", slog.Int("attempt", attempt), slog.String("error", err.Error()))
	}
	return err
}

// InTx runs fn in a ledger transaction (withTx), for a caller that records
// through the exported ...Tx methods outside a Stripe event's transaction
// (StripeEventHandle), such as a test's fixtures.
func (l *Ledger) InTx(ctx context.Context, fn func(tx *Tx) error) error {
	return l.withTx(ctx, fn)
}

func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40P01" || pgErr.Code == "40001"
	}
	return false
}

// run runs fn in tx, a transaction withTx opened, and commits it; it rolls
// it back when fn fails (or panics), as pgx.BeginFunc does.
func (tx *Tx) run(ctx context.Context, fn func() error) error {
	defer func() { _ = tx.Rollback(ctx) }() // after a commit, a no-op
	if err := fn(); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// savepoint runs fn in a savepoint of tx: released when fn returns nil,
// rolled back (with what fn queued and recorded) otherwise.
func (tx *Tx) savepoint(ctx context.Context, fn func(sp *Tx) error) error {
	sp, err := tx.savepointBegin(ctx)
	if err != nil {
		return err
	}
	return sp.run(ctx, func() error { return fn(sp) })
}

func (tx *Tx) savepointBegin(ctx context.Context) (*Tx, error) {
	if err := tx.begin(ctx); err != nil {
		return nil, err
	}
	sp, err := tx.pg.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &Tx{pg: sp, parent: tx}, nil
}

// Begin starts a savepoint that records like tx (for pgx.Tx; the ledger
// uses savepoint).
func (tx *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	return tx.savepointBegin(ctx)
}

// Rollback rolls back (to a savepoint), forgetting the queued statements;
// a transaction that never began has nothing to roll back.
func (tx *Tx) Rollback(ctx context.Context) error {
	tx.pending, tx.atCommit = nil, nil
	if tx.pg == nil {
		return nil
	}
	return tx.pg.Rollback(ctx)
}

// Commit sends the queued statements, then those queued for the commit
// (execAtCommit), and commits; a savepoint is released and hands its records
// and its statements for the commit to its parent. A transaction that never
// began has nothing to commit.
func (tx *Tx) Commit(ctx context.Context) error {
	if tx.parent == nil && len(tx.atCommit) > 0 {
		if tx.pending == nil {
			tx.pending = &pgx.Batch{}
		}
		tx.pending.QueuedQueries = append(tx.pending.QueuedQueries, tx.atCommit...)
		tx.atCommit = nil
	}
	if err := tx.flush(ctx); err != nil {
		return err
	}
	if tx.pg == nil {
		return nil
	}
	if err := tx.pg.Commit(ctx); err != nil {
		return err
	}
	if p := tx.parent; p != nil {
		p.atCommit = append(p.atCommit, tx.atCommit...)
		p.transitions = append(p.transitions, tx.transitions...)
		for _, n := range tx.notices {
			recordNotice(p, n)
		}
	}
	return nil
}

// recordTransition remembers a charge transition logged in tx.
func (tx *Tx) recordTransition(from *ChargeStatus, to ChargeStatus) {
	f := ""
	if from != nil {
		f = string(*from)
	}
	tx.transitions = append(tx.transitions, [2]string{f, string(to)})
}

// later is the result of a statement queued in a transaction, read once the
// statement has been sent.
type later[T any] struct {
	tx  *Tx
	val T
	ran bool
}

// get returns the statement's result, sending it now (with whatever else is
// queued) if it has not gone yet. After the transaction committed, it
// returns what the statement read.
func (d *later[T]) get(ctx context.Context) (T, error) {
	if !d.ran {
		if err := d.tx.flush(ctx); err != nil {
			var zero T
			return zero, err
		}
	}
	if !d.ran {
		var zero T
		return zero, errors.New("a queued statement was rolled back before it ran")
	}
	return d.val, nil
}

// queryLater queues sql in tx, for read to collect its rows into the
// result once it ran (read them to the end; they are closed after). An
// error of read fails the transaction.
func queryLater[T any](tx *Tx, read func(pgx.Rows) (T, error), sql string, args ...any) *later[T] {
	d := &later[T]{tx: tx}
	tx.queue(sql, args).Query(func(rows pgx.Rows) error {
		v, err := read(rows)
		if err != nil {
			return err
		}
		d.val, d.ran = v, true
		return nil
	})
	return d
}

// queryRowLater is queryLater for a statement that returns one row, given
// to scan once it ran. No row is an error of scan's, and so the
// transaction's.
func queryRowLater[T any](tx *Tx, scan func(pgx.Row) (T, error), sql string, args ...any) *later[T] {
	d := &later[T]{tx: tx}
	tx.queue(sql, args).QueryRow(func(row pgx.Row) error {
		v, err := scan(row)
		if err != nil {
			return err
		}
		d.val, d.ran = v, true
		return nil
	})
	return d
}

// execLater queues sql in tx, a statement whose result nothing reads.
// check, when set, is given its command tag once it ran; its error fails
// the transaction.
func (tx *Tx) execLater(check func(pgconn.CommandTag) error, sql string, args ...any) {
	q := tx.queue(sql, args)
	if check != nil {
		q.Exec(check)
	}
}

// execAtCommit queues sql in tx to go last, after everything else the
// transaction sends, in the round trip before its COMMIT: for a statement
// that locks a row every transaction of its kind needs (the statement
// counter), so that the others wait for this one's commit alone, not for
// the rest of it (River's completion, the notifications), which through a
// pooler costs more round trips (docs/benchmarks.md). Nothing in the
// transaction may read what it writes. A savepoint hands its statements to
// its parent when released; a rollback forgets them.
func (tx *Tx) execAtCommit(sql string, args ...any) {
	tx.atCommit = append(tx.atCommit, &pgx.QueuedQuery{SQL: sql, Arguments: args})
}

// ExecLater queues sql in tx, a transaction the ledger handed its caller (as
// ChargeRecordOutcome's done), to go with tx's next statement: for a
// statement whose result nothing needs, such as a SET LOCAL.
func (tx *Tx) ExecLater(sql string, args ...any) {
	tx.execLater(nil, sql, args...)
}

// queue appends a statement to those waiting for tx's next round trip.
func (tx *Tx) queue(sql string, args []any) *pgx.QueuedQuery {
	if tx.pending == nil {
		tx.pending = &pgx.Batch{}
	}
	return tx.pending.Queue(sql, args...)
}

// direct reports whether a statement can go straight to the transaction:
// it has begun and nothing is queued.
func (tx *Tx) direct() bool {
	return tx.pg != nil && (tx.pending == nil || tx.pending.Len() == 0)
}

// straight reports whether a statement with args goes straight to the
// transaction rather than in a batch: nothing is due before it (the
// transaction has begun and nothing is queued), or its first argument is one
// of pgx's query options (planFresh), which a batch does not take, and what
// was due has been sent first.
func (tx *Tx) straight(ctx context.Context, args []any) (bool, error) {
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID, pgx.QueryRewriter:
			return true, tx.begin(ctx)
		}
	}
	return tx.direct(), nil
}

// send sends, in one round trip, BEGIN if the transaction has not begun,
// the queued statements, then final (if not nil), and reads the results of
// all but final. It returns the batch's results positioned at final's (the
// caller reads it and closes them); on an error the results are closed.
func (tx *Tx) send(ctx context.Context, final *pgx.QueuedQuery) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	lazy := tx.pg == nil
	if lazy {
		b.BeginTx(pgx.TxOptions{})
	}
	if tx.pending != nil {
		b.QueuedQueries = append(b.QueuedQueries, tx.pending.QueuedQueries...)
		tx.pending = nil
	}
	if final != nil {
		b.QueuedQueries = append(b.QueuedQueries, final)
	}
	var br pgx.BatchResults
	if lazy {
		br = tx.pool.SendBatch(ctx, b)
		tx.pg = br.Tx() // committed or rolled back by withTx, which releases the connection
	} else {
		br = tx.pg.SendBatch(ctx, b)
	}
	for i, q := range b.QueuedQueries {
		if q == final {
			break
		}
		var err error
		if q.Fn != nil {
			err = q.Fn(br)
		} else {
			_, err = br.Exec()
		}
		if err != nil {
			_ = br.Close()
			if lazy && i == 0 {
				return nil, err // BEGIN
			}
			sql := strings.Join(strings.Fields(q.SQL), " ")
			if errors.Is(err, pgx.ErrNoRows) {
				// Not final's "no rows": a caller (or River's driver, which
				// reads it as "not found") must not take it for its own.
				return nil, fmt.Errorf("error in a statement sent ahead (%.80s): %v", sql, err) //nolint:errorlint // not to be unwrapped
			}
			return nil, fmt.Errorf("error in a statement sent ahead (%.80s): %w", sql, err)
		}
	}
	return br, nil
}

// flush sends what is queued (and BEGIN, if the transaction has not begun).
func (tx *Tx) flush(ctx context.Context) error {
	if tx.pending == nil || tx.pending.Len() == 0 {
		return nil
	}
	return tx.sendDue(ctx)
}

// begin sends BEGIN and the queued statements, if any is due.
func (tx *Tx) begin(ctx context.Context) error {
	if tx.direct() {
		return nil
	}
	return tx.sendDue(ctx)
}

// sendDue sends BEGIN (if the transaction has not begun) and the queued
// statements, and reads their results.
func (tx *Tx) sendDue(ctx context.Context) error {
	br, err := tx.send(ctx, nil)
	if err != nil {
		return err
	}
	return br.Close()
}

// Exec runs sql, sending BEGIN and the queued statements with it.
func (tx *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if straight, err := tx.straight(ctx, args); err != nil {
		return pgconn.CommandTag{}, err
	} else if straight {
		return tx.pg.Exec(ctx, sql, args...)
	}
	br, err := tx.send(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// QueryRow runs sql when its row is scanned, sending BEGIN and the queued
// statements with it.
func (tx *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if straight, err := tx.straight(ctx, args); err != nil {
		return errRow{err}
	} else if straight {
		return tx.pg.QueryRow(ctx, sql, args...)
	}
	return &sentRow{ctx: ctx, tx: tx, sql: sql, args: args}
}

// errRow is a row that fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// sentRow is a row whose statement is sent when it is scanned.
type sentRow struct {
	ctx  context.Context
	tx   *Tx
	sql  string
	args []any
}

func (r *sentRow) Scan(dest ...any) error {
	br, err := r.tx.send(r.ctx, &pgx.QueuedQuery{SQL: r.sql, Arguments: r.args})
	if err != nil {
		return err
	}
	err = br.QueryRow().Scan(dest...)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// Query runs sql, sending BEGIN and the queued statements with it. The rows
// must be closed, as always, before the next statement.
func (tx *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if straight, err := tx.straight(ctx, args); err != nil {
		return nil, err
	} else if straight {
		return tx.pg.Query(ctx, sql, args...)
	}
	br, err := tx.send(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &sentRows{Rows: rows, br: br}, nil
}

// sentRows are the rows of a statement sent in a batch, whose results close
// with them.
type sentRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *sentRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *sentRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *sentRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// SendBatch sends b after BEGIN and the queued statements.
func (tx *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := tx.begin(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return tx.pg.SendBatch(ctx, b)
}

// CopyFrom copies after BEGIN and the queued statements.
func (tx *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := tx.begin(ctx); err != nil {
		return 0, err
	}
	return tx.pg.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares after BEGIN and the queued statements.
func (tx *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := tx.begin(ctx); err != nil {
		return nil, err
	}
	return tx.pg.Prepare(ctx, name, sql)
}

// LargeObjects is not used by the ledger.
func (tx *Tx) LargeObjects() pgx.LargeObjects {
	panic("ledger transactions do not use large objects")
}

// Conn is the transaction's connection, nil before it began.
func (tx *Tx) Conn() *pgx.Conn {
	if tx.pg == nil {
		return nil
	}
	return tx.pg.Conn()
}
