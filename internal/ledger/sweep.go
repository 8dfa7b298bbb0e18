package ledger

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// SweepJobs is what the sweeps (PeriodSweepLostJobs, StripeEventSweep) need
// from the job queue, in the caller's transaction, so what they find and
// what they do about it commit together. internal/jobs implements it with
// River.
type SweepJobs interface {
	// JobStatesTx returns the state of each job of ids that the queue still
	// has ("available", "scheduled", "running", "retryable", "pending",
	// "completed", "cancelled", "discarded"); a job the queue has deleted
	// (River deletes finished jobs after its retention) is absent.
	JobStatesTx(ctx context.Context, tx pgx.Tx, ids []int64) (map[int64]string, error)

	// JobRetryTx makes a finished job (completed, cancelled or discarded)
	// available to run at once; a discarded job gets one more attempt.
	JobRetryTx(ctx context.Context, tx pgx.Tx, id int64) error
}

// What a sweep reports as the state of a job that the queue cannot run any
// more, besides River's own finished states.
const (
	// JobStateDeleted: the row names a job the queue no longer has.
	JobStateDeleted = "deleted"

	// JobStateNone: the row names no job at all.
	JobStateNone = "none"
)

// jobLive reports whether a job in state will still run (or is running):
// River's available, scheduled, running, retryable and pending. Completed,
// cancelled and discarded jobs, and jobs the queue deleted, never run again
// by themselves.
func jobLive(state string) bool {
	switch state {
	case "available", "scheduled", "running", "retryable", "pending":
		return true
	}
	return false
}

// sweepPageSize is how many rows one sweep transaction looks at.
const sweepPageSize = 500

// jobStateOf returns the state of the job id names, as the sweeps report it.
func jobStateOf(id *int64, states map[int64]string) string {
	if id == nil {
		return JobStateNone
	}
	if s, ok := states[*id]; ok {
		return s
	}
	return JobStateDeleted
}

// jobIDs returns the non-nil ids.
func jobIDs(ids []*int64) []int64 {
	out := make([]int64, 0, len(ids))
	for _, id := range ids {
		if id != nil {
			out = append(out, *id)
		}
	}
	return out
}
