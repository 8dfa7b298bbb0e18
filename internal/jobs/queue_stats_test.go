package jobs_test

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"testing"

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
	_, err = b.Pool.Exec(ctx, `
INSERT INTO river.river_job (args, kind, max_attempts, priority, queue, state, scheduled_at)
SELECT jsonb_build_object('n', i), 'queue_stats_test', 1, 1, 'queue_stats_test', 'scheduled', now() + interval '1 hour'
FROM generate_series(1, 2000) AS i`)
	require.NoError(t, err)
	analyzed, err = jobs.QueueStatsAnalyze(ctx, b.Pool, b.Logger)
	require.NoError(t, err)
	require.True(t, analyzed)
	require.GreaterOrEqual(t, reltuples(), float64(2000), "the statistics count the burst")
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
