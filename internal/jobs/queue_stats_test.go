package jobs_test

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
)

// TestQueueStatsAnalyze: river_job is analyzed once a burst of jobs made its
// statistics stale, seen from the table's size at once (the activity
// counters may lag by seconds), and not while it is as analyzed.
func TestQueueStatsAnalyze(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	reltuples := func() float64 {
		var n float64
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = 'river.river_job'::regclass`).Scan(&n))
		return n
	}

	analyzed, err := jobs.QueueStatsAnalyze(ctx, b.Pool, b.Logger)
	require.NoError(t, err)
	require.False(t, analyzed, "a new, empty table is as analyzed")

	// A mass of charge jobs due at one close, as ingest leaves them.
	conn, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	write := func(sql string) {
		t.Helper()
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err)
		// Report the session's counters now rather than within 10 s.
		_, err = conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SELECT 1`)
		require.NoError(t, err)
	}
	write(`
INSERT INTO river.river_job (args, kind, max_attempts, priority, queue, state, scheduled_at)
SELECT jsonb_build_object('n', i), 'queue_stats_test', 1, 1, 'queue_stats_test', 'scheduled', now() + interval '1 hour'
FROM generate_series(1, 2000) AS i`)
	analyzed, err = jobs.QueueStatsAnalyze(ctx, b.Pool, b.Logger)
	require.NoError(t, err)
	require.True(t, analyzed)
	require.GreaterOrEqual(t, reltuples(), float64(2000), "the statistics count the burst")

	// 100 rows changed of 2,000 is below the rule (50 + 10 %); 300 is above.
	modified := func() int64 {
		var n int64
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT n_mod_since_analyze FROM pg_stat_user_tables
WHERE schemaname = 'river' AND relname = 'river_job'`).Scan(&n))
		return n
	}
	write(`UPDATE river.river_job SET priority = 2 WHERE kind = 'queue_stats_test' AND (args->>'n')::int <= 100`)
	require.Eventually(t, func() bool { return modified() >= 100 }, 15*time.Second, 50*time.Millisecond)
	analyzed, err = jobs.QueueStatsAnalyze(ctx, b.Pool, b.Logger)
	require.NoError(t, err)
	require.False(t, analyzed, "%d rows changed of 2,000 is not stale", modified())
	write(`UPDATE river.river_job SET priority = 3 WHERE kind = 'queue_stats_test' AND (args->>'n')::int <= 200`)
	require.Eventually(t, func() bool { return modified() >= 300 }, 15*time.Second, 50*time.Millisecond)
	analyzed, err = jobs.QueueStatsAnalyze(ctx, b.Pool, b.Logger)
	require.NoError(t, err)
	require.True(t, analyzed, "%d rows changed of 2,000 is stale", modified())
}

// TestQueueStatsNotOwner: a role that may not analyze river_job is told so
// (QueueStatsKeep then stops and leaves the statistics to autovacuum)
// rather than analyzing in vain every second.
func TestQueueStatsNotOwner(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	role := fmt.Sprintf("tally_queue_stats_%d", rand.Uint32())
	_, err := b.Pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.Pool.Exec(ctx, "DROP ROLE IF EXISTS "+role) })

	u, err := url.Parse(b.URL)
	require.NoError(t, err)
	u.User = url.User(role)
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = jobs.QueueStatsAnalyze(ctx, pool, b.Logger)
	require.ErrorIs(t, err, jobs.ErrQueueStatsNotOwner)
}
