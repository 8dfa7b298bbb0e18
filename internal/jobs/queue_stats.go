package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-billing/tally/internal/schema"
)

// River plans its queries for river_job as the table's statistics describe
// it. On a table never analyzed since it filled up (a new database;
// autovacuum off, or behind a burst), the planner takes the charge jobs due
// at a close for a handful of rows, and River's scheduling query, which
// checks every due job's unique key against every other (JobSchedule's
// unique_conflicts), runs as a nested loop over them: its cost grows with the
// square of the jobs due at once, and a mass close stalls on it
// (docs/benchmarks.md, "Figures behind the code's choices"). QueueStatsKeep
// keeps the statistics of river_job current the way autovacuum's analyze
// would, so a mass close costs what the jobs cost.

// queueStatsEvery is how often QueueStatsKeep looks at river_job's
// statistics: one read of Postgres's activity counters, in memory.
const queueStatsEvery = time.Second

// The staleness rule of river_job's statistics. The first half is
// autovacuum's analyze rule with its defaults: 50 rows plus 10% of the table
// changed since the last analyze. Those counters reach Postgres's activity
// statistics only when the writing sessions report them, up to 10 s after
// an idle session's last write, so the second half looks at the table's
// size on disk, which is current: grown by more than 8 pages plus 10% since
// the statistics were taken (pg_class.relpages).
const (
	queueStatsThresholdRows  = 50
	queueStatsThresholdShare = 0.1
	queueStatsThresholdPages = 8
)

// QueueStatsKeep keeps river_job's statistics current until ctx ends: every
// queueStatsEvery it analyzes the table when it is stale (QueueStatsAnalyze).
// Every worker replica runs it; an advisory lock makes one analyze at a
// time, and the others then find the statistics fresh. It is a loop rather
// than a periodic River job, which would add a job row every second.
func QueueStatsKeep(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) {
	t := time.NewTicker(queueStatsEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := QueueStatsAnalyze(ctx, pool, logger)
		if errors.Is(err, ErrQueueStatsNotOwner) {
			logger.WarnContext(ctx, "not keeping river_job's statistics: autovacuum must", slog.String("error", err.Error()))
			return
		}
		if err != nil && ctx.Err() == nil {
			logger.WarnContext(ctx, "error keeping river_job's statistics", slog.String("error", err.Error()))
		}
	}
}

// ErrQueueStatsNotOwner is QueueStatsAnalyze's answer when Tally's database
// role may not analyze river_job (Postgres 15 lets the table's owner, the
// database's owner and superusers): its statistics are then autovacuum's
// alone.
var ErrQueueStatsNotOwner = errors.New("this role may not analyze river_job: it owns neither the table nor the database")

// QueueStatsAnalyze analyzes river_job if enough of it changed since its
// statistics were last taken (by autovacuum or by this function), and
// reports whether it did. It skips when another process is analyzing.
func QueueStatsAnalyze(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (bool, error) {
	// The check, every second on every replica, is one statement outside
	// any transaction; only a stale table opens one.
	var changed, live int64
	var stale, mayAnalyze bool
	err := pool.QueryRow(ctx, `
SELECT s.n_mod_since_analyze, s.n_live_tup,
       s.n_mod_since_analyze > $2 + $3::float8 * s.n_live_tup
       OR pg_relation_size(c.oid) / current_setting('block_size')::int > $4 + (1 + $3::float8) * greatest(c.relpages, 0),
       pg_has_role(c.relowner, 'USAGE')
       OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE')
       OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = $1 AND s.relname = 'river_job'`,
		schema.RiverSchema, queueStatsThresholdRows, queueStatsThresholdShare, queueStatsThresholdPages).Scan(&changed, &live, &stale, &mayAnalyze)
	if err != nil {
		return false, fmt.Errorf("error reading statistics of river_job: %w", err)
	}
	if !mayAnalyze {
		return false, ErrQueueStatsNotOwner
	}
	if !stale {
		return false, nil
	}
	var analyzed bool
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// One replica at a time, and never waiting behind autovacuum (a
		// waiting ANALYZE would cancel it) or another maintenance command:
		// the next second tries again.
		var locked bool
		if err := tx.QueryRow(ctx, `
SELECT pg_try_advisory_xact_lock(hashtextextended('tally.queue_stats', 0)), set_config('lock_timeout', '100ms', true)`).Scan(&locked, nil); err != nil {
			return fmt.Errorf("error locking the analyze of river_job: %w", err)
		}
		if !locked {
			return nil // another replica is analyzing
		}
		start := time.Now()
		if _, err := tx.Exec(ctx, `ANALYZE (SKIP_LOCKED) `+schema.RiverSchema+`.river_job`); err != nil {
			return fmt.Errorf("error analyzing river_job: %w", err)
		}
		analyzed = true
		logger.InfoContext(ctx, "ran ANALYZE on river_job: its statistics were stale", slog.Int64("rows_changed", changed),
			slog.Int64("rows", live), slog.Duration("took", time.Since(start)))
		return nil
	})
	return analyzed, err
}
