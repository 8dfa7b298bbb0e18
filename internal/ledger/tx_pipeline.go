package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A ledger transaction (recordingTx) saves round trips to Postgres, which
// are most of what a charge costs on a busy machine (docs/benchmarks.md):
//
//   - it begins lazily: BEGIN is sent with its first statement, in one round
//     trip (pgx.Batch.BeginTx), and a transaction that sends nothing sends no
//     BEGIN either;
//   - a write whose result nothing reads before the next statement is queued
//     (laterExec, laterRow) and sent with that next statement, in the same
//     round trip, at the latest before the transaction commits.
//
// Statements still run one after the other, in the order they were issued,
// in the one transaction: what a statement sees is what it would see sent
// alone. A queued write that fails fails the statement it was sent with
// (its error, not that statement's, is returned), and so the transaction;
// a queued read that finds no row is an error of its own, never that
// statement's pgx.ErrNoRows.

// laterExec runs sql in tx: queued until tx's next statement when tx is a
// ledger transaction, at once otherwise. check, when set, is given the
// statement's command tag once it ran; its error fails the transaction.
func laterExec(ctx context.Context, tx pgx.Tx, check func(pgconn.CommandTag) error, sql string, args ...any) error {
	if check == nil {
		check = func(pgconn.CommandTag) error { return nil }
	}
	rec, ok := tx.(*recordingTx)
	if !ok {
		tag, err := tx.Exec(ctx, sql, args...)
		if err != nil {
			return err
		}
		return check(tag)
	}
	rec.queue(sql, args).Exec(check)
	return nil
}

// ExecLater runs sql in tx, a transaction the ledger handed to its caller
// (as ChargeRecordOutcome's done): with tx's next statement, in the same
// round trip, when tx is a ledger transaction; at once otherwise. For a
// statement whose result nothing needs, such as a SET LOCAL.
func ExecLater(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
	return laterExec(ctx, tx, nil, sql, args...)
}

// laterRow is laterExec for a statement that returns one row, given to scan
// once it ran.
func laterRow(ctx context.Context, tx pgx.Tx, scan func(pgx.Row) error, sql string, args ...any) error {
	rec, ok := tx.(*recordingTx)
	if !ok {
		return scan(tx.QueryRow(ctx, sql, args...))
	}
	rec.queue(sql, args).QueryRow(scan)
	return nil
}

// laterRows is laterExec for a statement that returns rows, given to read
// once it ran (read them to the end; they are closed after).
func laterRows(ctx context.Context, tx pgx.Tx, read func(pgx.Rows) error, sql string, args ...any) error {
	rec, ok := tx.(*recordingTx)
	if !ok {
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		if err := read(rows); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	rec.queue(sql, args).Query(read)
	return nil
}

// queue appends a statement to those waiting for tx's next round trip.
func (tx *recordingTx) queue(sql string, args []any) *pgx.QueuedQuery {
	if tx.pending == nil {
		tx.pending = &pgx.Batch{}
	}
	return tx.pending.Queue(sql, args...)
}

// direct reports whether a statement can go straight to the transaction:
// it has begun and nothing is queued.
func (tx *recordingTx) direct() bool {
	return tx.Tx != nil && (tx.pending == nil || tx.pending.Len() == 0)
}

// straight reports whether a statement with args goes straight to the
// transaction rather than in a batch: nothing is due before it (the
// transaction has begun and nothing is queued), or its first argument is one
// of pgx's query options (planFresh), which a batch does not take, and what
// was due has been sent first.
func (tx *recordingTx) straight(ctx context.Context, args []any) (bool, error) {
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
func (tx *recordingTx) send(ctx context.Context, final *pgx.QueuedQuery) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	lazy := tx.Tx == nil
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
		tx.Tx = br.Tx() // committed or rolled back by withTx, which releases the connection
	} else {
		br = tx.Tx.SendBatch(ctx, b)
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

// flush sends what is queued (and BEGIN, if the transaction has begun
// nowhere yet but has something queued).
func (tx *recordingTx) flush(ctx context.Context) error {
	if tx.pending == nil || tx.pending.Len() == 0 {
		return nil
	}
	return tx.sendDue(ctx)
}

// begin sends BEGIN and the queued statements, if any is due.
func (tx *recordingTx) begin(ctx context.Context) error {
	if tx.direct() {
		return nil
	}
	return tx.sendDue(ctx)
}

// sendDue sends BEGIN (if the transaction has not begun) and the queued
// statements, and reads their results.
func (tx *recordingTx) sendDue(ctx context.Context) error {
	br, err := tx.send(ctx, nil)
	if err != nil {
		return err
	}
	return br.Close()
}

// Exec runs sql, sending BEGIN and the queued statements with it.
func (tx *recordingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if straight, err := tx.straight(ctx, args); err != nil {
		return pgconn.CommandTag{}, err
	} else if straight {
		return tx.Tx.Exec(ctx, sql, args...)
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
func (tx *recordingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if straight, err := tx.straight(ctx, args); err != nil {
		return errRow{err}
	} else if straight {
		return tx.Tx.QueryRow(ctx, sql, args...)
	}
	return &sentRow{ctx: ctx, tx: tx, sql: sql, args: args}
}

// errRow is a row that fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// sentRow is a row whose statement is sent when it is scanned.
type sentRow struct {
	ctx  context.Context
	tx   *recordingTx
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
func (tx *recordingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if straight, err := tx.straight(ctx, args); err != nil {
		return nil, err
	} else if straight {
		return tx.Tx.Query(ctx, sql, args...)
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
func (tx *recordingTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := tx.begin(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return tx.Tx.SendBatch(ctx, b)
}

// CopyFrom copies after BEGIN and the queued statements.
func (tx *recordingTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := tx.begin(ctx); err != nil {
		return 0, err
	}
	return tx.Tx.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares after BEGIN and the queued statements.
func (tx *recordingTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := tx.begin(ctx); err != nil {
		return nil, err
	}
	return tx.Tx.Prepare(ctx, name, sql)
}

// LargeObjects is not used by the ledger.
func (tx *recordingTx) LargeObjects() pgx.LargeObjects {
	panic("ledger transactions do not use large objects")
}

// Conn is the transaction's connection, nil before it began.
func (tx *recordingTx) Conn() *pgx.Conn {
	if tx.Tx == nil {
		return nil
	}
	return tx.Tx.Conn()
}
