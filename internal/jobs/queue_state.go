package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-billing/tally/internal/schema"
)

// QueueState is what River's job table says, for an operator's gauges.
type QueueState struct {
	// Jobs counts the jobs not completed, by queue and state (available,
	// scheduled, running, retryable, discarded, cancelled).
	Jobs map[[2]string]int64

	// ChargeAvailableSince is since when the oldest charge job has been
	// available to run without a worker taking it (the outbox's lag), or
	// nil when none waits.
	ChargeAvailableSince *time.Time
}

// QueueStateGet reads the QueueState from River's table on pool. Both reads
// go through River's (state, queue, …) index and skip completed jobs, so
// they cost what is in flight, not the table's history.
func QueueStateGet(ctx context.Context, pool *pgxpool.Pool) (*QueueState, error) {
	st := &QueueState{Jobs: map[[2]string]int64{}}
	rows, err := pool.Query(ctx, fmt.Sprintf(`
SELECT queue, state::text, count(*) FROM %s.river_job
WHERE state IN ('available', 'scheduled', 'running', 'retryable', 'discarded', 'cancelled')
GROUP BY 1, 2`, schema.RiverSchema))
	if err != nil {
		return nil, fmt.Errorf("error counting jobs: %w", err)
	}
	var queue, state string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&queue, &state, &n}, func() error {
		st.Jobs[[2]string{queue, state}] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("error counting jobs: %w", err)
	}
	if err := pool.QueryRow(ctx, fmt.Sprintf(`
SELECT min(scheduled_at) FROM %s.river_job WHERE state = 'available' AND queue = $1`, schema.RiverSchema),
		QueueCharges).Scan(&st.ChargeAvailableSince); err != nil {
		return nil, fmt.Errorf("error reading the oldest available charge job: %w", err)
	}
	return st, nil
}
