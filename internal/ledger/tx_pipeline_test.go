package ledger_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// A ledger transaction sends BEGIN with its first statement and a queued
// write with the statement after it; statements still run in order, in one
// transaction, and a queued write that fails fails the transaction.
func TestTxPipeline(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	l, counter := countingLedger(t, b, ledger.Config{})
	_, err := b.Pool.Exec(ctx, `CREATE TABLE pipeline_test (id int PRIMARY KEY, v text NOT NULL)`)
	require.NoError(t, err)
	count := func() int64 { return b.Count(t, `SELECT count(*) FROM pipeline_test`) }
	insert := func(ctx context.Context, tx pgx.Tx, id int, v string) error {
		return ledger.LaterExec(ctx, tx, nil, `INSERT INTO pipeline_test (id, v) VALUES ($1, $2)`, id, v)
	}

	t.Run("NothingSentNothingBegun", func(t *testing.T) {
		counter.reset()
		require.NoError(t, l.WithTx(ctx, func(pgx.Tx) error { return nil }))
		require.Zero(t, counter.n.Load(), "round trips:%s", counter)
	})

	t.Run("BeginRidesWithTheFirstStatement", func(t *testing.T) {
		counter.reset()
		var one int
		require.NoError(t, l.WithTx(ctx, func(tx pgx.Tx) error { return tx.QueryRow(ctx, `SELECT 1`).Scan(&one) }))
		require.Equal(t, 1, one)
		require.Equal(t, int64(2), counter.n.Load(), "begin with the select, commit:%s", counter)
	})

	t.Run("QueuedWritesRideWithTheNextStatementAndAreSeenByIt", func(t *testing.T) {
		counter.reset()
		var seen int64
		var id int
		err := l.WithTx(ctx, func(tx pgx.Tx) error {
			if err := insert(ctx, tx, 1, "a"); err != nil {
				return err
			}
			if err := ledger.LaterRow(ctx, tx, func(row pgx.Row) error { return row.Scan(&id) },
				`INSERT INTO pipeline_test (id, v) VALUES (2, 'b') RETURNING id`); err != nil {
				return err
			}
			require.Zero(t, id, "not sent yet")
			return tx.QueryRow(ctx, `SELECT count(*) FROM pipeline_test`).Scan(&seen)
		})
		require.NoError(t, err)
		require.Equal(t, int64(2), seen, "the read sees the writes queued before it")
		require.Equal(t, 2, id, "the queued statement's row is read when it is sent")
		require.Equal(t, int64(2), counter.n.Load(), "begin with both inserts and the select, commit:%s", counter)
		require.Equal(t, int64(2), count())
	})

	t.Run("QueuedWritesAreSentBeforeTheCommit", func(t *testing.T) {
		counter.reset()
		require.NoError(t, l.WithTx(ctx, func(tx pgx.Tx) error { return insert(ctx, tx, 3, "c") }))
		require.Equal(t, int64(3), count())
		require.Equal(t, int64(2), counter.n.Load(), "begin with the insert, commit:%s", counter)
	})

	t.Run("AFailedQueuedWriteFailsTheTransaction", func(t *testing.T) {
		var reached bool
		err := l.WithTx(ctx, func(tx pgx.Tx) error {
			if err := insert(ctx, tx, 4, "d"); err != nil {
				return err
			}
			if err := insert(ctx, tx, 1, "duplicate"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO pipeline_test (id, v) VALUES (5, 'e')`)
			reached = true
			return err
		})
		require.True(t, reached)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23505", pgErr.Code, "the duplicate's error: %v", err)
		require.ErrorContains(t, err, "sent ahead")
		require.Equal(t, int64(3), count(), "rolled back: neither 4 nor 5")
	})

	t.Run("AQueuedReadWithoutRowIsNotTheNextStatementsNoRows", func(t *testing.T) {
		// River's driver reads pgx.ErrNoRows from its own statement as "not
		// found" (the kill switch's queue row: not paused); a queued read's
		// missing row must fail as what it is.
		var v string
		err := l.WithTx(ctx, func(tx pgx.Tx) error {
			if err := ledger.LaterRow(ctx, tx, func(row pgx.Row) error { return row.Scan(&v) },
				`SELECT v FROM pipeline_test WHERE id = -1`); err != nil {
				return err
			}
			var one int
			return tx.QueryRow(ctx, `SELECT 1`).Scan(&one)
		})
		require.ErrorContains(t, err, "sent ahead")
		require.ErrorContains(t, err, pgx.ErrNoRows.Error())
		require.NotErrorIs(t, err, pgx.ErrNoRows)
	})

	t.Run("AFailedCheckFailsTheTransaction", func(t *testing.T) {
		errCheck := errors.New("no row updated")
		err := l.WithTx(ctx, func(tx pgx.Tx) error {
			if err := insert(ctx, tx, 6, "f"); err != nil {
				return err
			}
			return ledger.LaterExec(ctx, tx, func(tag pgconn.CommandTag) error {
				if tag.RowsAffected() != 1 {
					return errCheck
				}
				return nil
			}, `UPDATE pipeline_test SET v = 'x' WHERE id = 99`)
		})
		require.ErrorIs(t, err, errCheck)
		require.Equal(t, int64(3), count(), "6 rolled back")
	})

	t.Run("ASavepointRolledBackDropsItsQueuedWrites", func(t *testing.T) {
		err := l.WithTx(ctx, func(tx pgx.Tx) error {
			if err := insert(ctx, tx, 7, "g"); err != nil {
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := insert(ctx, sp, 8, "h"); err != nil {
				return err
			}
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
			return insert(ctx, tx, 9, "i")
		})
		require.NoError(t, err)
		require.Equal(t, int64(5), count(), "7 and 9, not 8")
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pipeline_test WHERE id = 8`))
	})
}
