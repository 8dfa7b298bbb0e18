package ledger_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// requireForeignKeyViolation requires err to be Postgres' foreign_key_violation.
func requireForeignKeyViolation(t *testing.T, err error, contains string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want a Postgres error, got %v", err)
	require.Equal(t, "23503", pgErr.Code, pgErr.Message)
	require.Contains(t, pgErr.Message, contains)
}

// TestUsageEventPeriodCheck holds what the foreign key from usage_events to
// periods guaranteed, now that a statement trigger checks it (migration 00013):
// no event without its period, in a single-row or a multi-row insert, and no
// period with events deleted or re-keyed; the single-event statement, which
// inserts from its period's row, is the one statement not checked (00018).
func TestUsageEventPeriodCheck(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	res, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
	require.NoError(t, err)
	period := res.Event.Period

	const insert = `
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, occurred_at, received_at, payload_hash)
SELECT 'acme', e, p, 1, 'usd', now(), now(), sha256(e::bytea)
FROM unnest($1::text[], $2::text[]) AS x (e, p)`

	// In this order, not by name: OneOfManyWithoutPeriod counts the events before EventsWithPeriod adds two.
	t.Run("EventWithoutPeriod", func(t *testing.T) {
		_, err := b.Pool.Exec(ctx, insert, []string{"x1"}, []string{"1999-01"})
		requireForeignKeyViolation(t, err, "period 1999-01 of customer acme does not exist")
	})

	t.Run("OneOfManyWithoutPeriod", func(t *testing.T) {
		_, err := b.Pool.Exec(ctx, insert, []string{"x2", "x3", "x4"}, []string{period, "1999-01", period})
		requireForeignKeyViolation(t, err, "period 1999-01 of customer acme does not exist")
		require.Equal(t, int64(1), b.eventCount(t), "the statement wrote nothing")
	})

	t.Run("EventsWithPeriod", func(t *testing.T) {
		_, err := b.Pool.Exec(ctx, insert, []string{"x5", "x6"}, []string{period, period})
		require.NoError(t, err)
	})

	t.Run("SingleEventStatementAloneSkipsTheCheck", func(t *testing.T) {
		// The single-event statement inserts from its period's row, held
		// FOR KEY SHARE, and marks itself (migration 00018): the check skips
		// it, and only it — a later statement of the same transaction, a
		// plain insert here, is checked.
		tx, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // a rollback after the test's statements
		_, err = tx.Exec(ctx, `SET LOCAL track_functions = 'pl'`)
		require.NoError(t, err)
		checks := func() (n int64) {
			t.Helper()
			require.NoError(t, tx.QueryRow(ctx, `
SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE schemaname = 'billing' AND funcname = 'usage_events_period_exists'`).Scan(&n))
			return n
		}
		now := b.Ledger.Now()
		tag, err := tx.Exec(ctx, ledger.UsageEventInsertOpenCall,
			"acme", "s1", period, 100, "", nil, nil, []byte(`{}`), now, now, make([]byte, 32))
		require.NoError(t, err)
		require.Equal(t, int64(1), tag.RowsAffected())
		require.Zero(t, checks(), "the single-event statement is not checked")
		_, err = tx.Exec(ctx, insert, []string{"s2"}, []string{period})
		require.NoError(t, err)
		require.Equal(t, int64(1), checks(), "the next statement is")
		_, err = tx.Exec(ctx, insert, []string{"s3"}, []string{"1999-01"})
		requireForeignKeyViolation(t, err, "period 1999-01 of customer acme does not exist")
	})

	t.Run("PeriodWithEventsNotDeleted", func(t *testing.T) {
		_, err := b.Pool.Exec(ctx, `DELETE FROM billing.periods WHERE customer_id = 'acme' AND period = $1`, period)
		requireForeignKeyViolation(t, err, "period "+period+" of customer acme has usage events")
	})

	t.Run("PeriodWithEventsNotReKeyed", func(t *testing.T) {
		_, err := b.Pool.Exec(ctx, `UPDATE billing.periods SET period = '1999-02' WHERE customer_id = 'acme' AND period = $1`, period)
		requireForeignKeyViolation(t, err, "has usage events")
	})

	t.Run("PeriodWithoutEventsDeleted", func(t *testing.T) {
		// A period of another customer, with no event: the rule is the
		// foreign key's, not a ban on deleting periods.
		b.Customer(t, "solo")
		_, err := b.Pool.Exec(ctx, `
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, created_at)
VALUES ('solo', '1999-01', 'usd', '1999-01-01', '1999-02-01', '1999-02-02', now())`)
		require.NoError(t, err)
		tag, err := b.Pool.Exec(ctx, `DELETE FROM billing.periods WHERE customer_id = 'solo' AND period = '1999-01'`)
		require.NoError(t, err)
		require.Equal(t, int64(1), tag.RowsAffected())
	})
}
