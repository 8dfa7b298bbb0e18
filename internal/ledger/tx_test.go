package ledger_test

import (
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
	insert := func(tx *ledger.Tx, id int, v string) {
		tx.ExecLater(`INSERT INTO pipeline_test (id, v) VALUES ($1, $2)`, id, v)
	}
	scanInt := func(row pgx.Row) (int, error) {
		var v int
		err := row.Scan(&v)
		return v, err
	}

	t.Run("NothingSentNothingBegun", func(t *testing.T) {
		counter.reset()
		require.NoError(t, l.InTx(ctx, func(*ledger.Tx) error { return nil }))
		require.Zero(t, counter.n.Load(), "round trips:%s", counter)
	})

	t.Run("BeginRidesWithTheFirstStatement", func(t *testing.T) {
		counter.reset()
		var one int
		require.NoError(t, l.InTx(ctx, func(tx *ledger.Tx) error { return tx.QueryRow(ctx, `SELECT 1`).Scan(&one) }))
		require.Equal(t, 1, one)
		require.Equal(t, int64(2), counter.n.Load(), "begin with the select, commit:%s", counter)
	})

	t.Run("QueuedWritesRideWithTheNextStatementAndAreSeenByIt", func(t *testing.T) {
		counter.reset()
		var seen int64
		var id int
		err := l.InTx(ctx, func(tx *ledger.Tx) error {
			insert(tx, 1, "a")
			inserted := ledger.QueryRowLater(tx, scanInt, `INSERT INTO pipeline_test (id, v) VALUES (2, 'b') RETURNING id`)
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM pipeline_test`).Scan(&seen); err != nil {
				return err
			}
			var err error
			id, err = inserted.Get(ctx) // sent with the select
			return err
		})
		require.NoError(t, err)
		require.Equal(t, int64(2), seen, "the read sees the writes queued before it")
		require.Equal(t, 2, id, "the queued statement's row, read when it was sent")
		require.Equal(t, int64(2), counter.n.Load(), "begin with both inserts and the select, commit:%s", counter)
		require.Equal(t, int64(2), count())
	})

	t.Run("QueuedWritesAreSentBeforeTheCommit", func(t *testing.T) {
		counter.reset()
		require.NoError(t, l.InTx(ctx, func(tx *ledger.Tx) error { insert(tx, 3, "c"); return nil }))
		require.Equal(t, int64(3), count())
		require.Equal(t, int64(2), counter.n.Load(), "begin with the insert, commit:%s", counter)
	})

	t.Run("AFailedQueuedWriteFailsTheTransaction", func(t *testing.T) {
		var reached bool
		err := l.InTx(ctx, func(tx *ledger.Tx) error {
			insert(tx, 4, "d")
			insert(tx, 1, "duplicate")
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
		err := l.InTx(ctx, func(tx *ledger.Tx) error {
			ledger.QueryRowLater(tx, scanInt, `SELECT id FROM pipeline_test WHERE id = -1`)
			var one int
			return tx.QueryRow(ctx, `SELECT 1`).Scan(&one)
		})
		require.ErrorContains(t, err, "sent ahead")
		require.ErrorContains(t, err, pgx.ErrNoRows.Error())
		require.NotErrorIs(t, err, pgx.ErrNoRows)
	})

	t.Run("AFailedCheckFailsTheTransaction", func(t *testing.T) {
		errCheck := errors.New("no row updated")
		err := l.InTx(ctx, func(tx *ledger.Tx) error {
			insert(tx, 6, "f")
			ledger.ExecLaterChecked(tx, func(tag pgconn.CommandTag) error {
				if tag.RowsAffected() != 1 {
					return errCheck
				}
				return nil
			}, `UPDATE pipeline_test SET v = 'x' WHERE id = 99`)
			return nil
		})
		require.ErrorIs(t, err, errCheck)
		require.Equal(t, int64(3), count(), "6 rolled back")
	})

	t.Run("ASavepointRolledBackDropsItsQueuedWrites", func(t *testing.T) {
		var rolledBack *ledger.Later[int]
		err := l.InTx(ctx, func(tx *ledger.Tx) error {
			insert(tx, 7, "g")
			errRollback := errors.New("roll back")
			err := tx.Savepoint(ctx, func(sp *ledger.Tx) error {
				insert(sp, 8, "h")
				rolledBack = ledger.QueryRowLater(sp, scanInt, `SELECT 8`)
				return errRollback
			})
			require.ErrorIs(t, err, errRollback)
			_, err = rolledBack.Get(ctx)
			require.ErrorContains(t, err, "rolled back before it ran")
			insert(tx, 9, "i")
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, int64(5), count(), "7 and 9, not 8")
		require.Zero(t, b.Count(t, `SELECT count(*) FROM pipeline_test WHERE id = 8`))
	})

	t.Run("ALaterReadSendsWhatIsQueuedWithIt", func(t *testing.T) {
		counter.reset()
		var seen int
		err := l.InTx(ctx, func(tx *ledger.Tx) error {
			insert(tx, 10, "j")
			total := ledger.QueryRowLater(tx, scanInt, `SELECT count(*)::int FROM pipeline_test`)
			var err error
			seen, err = total.Get(ctx)
			return err
		})
		require.NoError(t, err)
		require.Equal(t, 6, seen, "the read sees the insert queued before it")
		require.Equal(t, int64(2), counter.n.Load(), "begin with the insert and the read, commit:%s", counter)
	})

	t.Run("AtCommitGoesLastWithTheCommitAndSavepointsHandItUp", func(t *testing.T) {
		counter.reset()
		var seen []int64
		seenNow := func(tx *ledger.Tx) error {
			var n int64
			err := tx.QueryRow(ctx, `SELECT count(*) FROM pipeline_test WHERE id BETWEEN 20 AND 29`).Scan(&n)
			seen = append(seen, n)
			return err
		}
		var order int
		err := l.InTx(ctx, func(tx *ledger.Tx) error {
			ledger.ExecAtCommit(tx, `INSERT INTO pipeline_test (id, v) VALUES (20, 'at commit')`)
			insert(tx, 21, "queued after, sent before")
			if err := tx.Savepoint(ctx, func(sp *ledger.Tx) error {
				ledger.ExecAtCommit(sp, `INSERT INTO pipeline_test (id, v) VALUES (22, 'released')`)
				return nil
			}); err != nil {
				return err
			}
			errRollback := errors.New("roll back")
			if err := tx.Savepoint(ctx, func(sp *ledger.Tx) error {
				ledger.ExecAtCommit(sp, `INSERT INTO pipeline_test (id, v) VALUES (23, 'rolled back')`)
				return errRollback
			}); !errors.Is(err, errRollback) {
				return err
			}
			if err := seenNow(tx); err != nil {
				return err
			}
			// The last statement of all: it sees 21 only, and 20 comes after.
			ledger.ExecLaterChecked(tx, nil, `INSERT INTO pipeline_test (id, v)
SELECT 24, count(*)::text FROM pipeline_test WHERE id BETWEEN 20 AND 23`)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, []int64{1}, seen, "nothing for the commit is sent before it")
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT v::int FROM pipeline_test WHERE id = 24`).Scan(&order))
		require.Equal(t, 1, order, "the statements for the commit go after every other")
		require.Equal(t, int64(4), b.Count(t, `SELECT count(*) FROM pipeline_test WHERE id BETWEEN 20 AND 29`), "20, 21, 22, 24; not 23")
		require.Equal(t, int64(8), counter.n.Load(),
			"begin, two savepoints, the read; the statements for the commit go with the last insert, not alone:%s", counter)
	})
}
