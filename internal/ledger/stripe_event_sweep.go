package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// StripeEventStuckReportEvery is how often StripeEventSweep reports an event
// that stays stuck.
const StripeEventStuckReportEvery = time.Hour

// StripeEventSweepParams are the fields of StripeEventSweep.
type StripeEventSweepParams struct {
	// ReceivedBefore bounds the events looked at: only unfinished events
	// received before it. The sweep passes now minus its grace, so a job that
	// simply has not run yet is left alone.
	ReceivedBefore time.Time

	// StuckAttempts and StuckBefore say when an unfinished event is stuck
	// (reported): it has failed at least StuckAttempts times, or it was
	// received before StuckBefore. A zero value disables its test.
	StuckAttempts int
	StuckBefore   time.Time

	// Jobs reads the state of the events' jobs and revives finished ones.
	// Required.
	Jobs SweepJobs
}

// StripeEventSwept is an unfinished Stripe event whose job the sweep ran
// again, or that it reports as stuck.
type StripeEventSwept struct {
	// Event is the event as the sweep found it (status received or failed).
	Event StripeEvent

	// JobState is the state its job was in: River's, JobStateDeleted or
	// JobStateNone.
	JobState string

	// Requeued says that its job could no longer run (discarded after its
	// retries, cancelled, deleted, never recorded) and now runs again;
	// NewJobID is that job.
	Requeued bool
	NewJobID int64

	// Stuck says that the event is stuck (StuckAttempts, StuckBefore) and was
	// not reported within StripeEventStuckReportEvery: report it now. The
	// event is marked reported.
	Stuck bool

	// Err says why its lost job could not be run again; the next sweep
	// tries again.
	Err error
}

// StripeEventSweep finds every Stripe event still received or failed that
// was received before p.ReceivedBefore. Where its job will not run any more,
// it makes the job run again in the transaction that found it (River's
// JobRetry of a finished job, which gives a discarded job one more attempt;
// a new job when River deleted it or none was recorded). Where the event is
// stuck and not reported in the last StripeEventStuckReportEvery, it marks it
// reported. It returns both kinds; events whose live job is merely retrying
// and that are not due for a report are left out. Events being processed at
// that moment are skipped (their row is locked). It works in pages of
// sweepPageSize events, one committed transaction each.
func (l *Ledger) StripeEventSweep(ctx context.Context, p StripeEventSweepParams) ([]StripeEventSwept, error) {
	if p.Jobs == nil {
		return nil, errors.New("error sweeping stripe events: StripeEventSweepParams.Jobs is required")
	}
	var all []StripeEventSwept
	var cursor *unfinishedEvent
	for {
		var page []unfinishedEvent
		var found []StripeEventSwept
		err := l.withTx(ctx, func(tx *Tx) error {
			found = nil
			now := l.now()
			var err error
			if page, err = unfinishedEventsTx(ctx, tx, p.ReceivedBefore, cursor); err != nil {
				return err
			}
			ids := make([]*int64, len(page))
			for i := range page {
				ids[i] = page[i].ev.JobID
			}
			states, err := p.Jobs.JobStatesTx(ctx, tx, jobIDs(ids))
			if err != nil {
				return fmt.Errorf("error reading stripe event jobs: %w", err)
			}
			for _, u := range page {
				s := StripeEventSwept{Event: u.ev, JobState: jobStateOf(u.ev.JobID, states)}
				stuck := (p.StuckAttempts > 0 && u.ev.Attempts >= p.StuckAttempts) ||
					(!p.StuckBefore.IsZero() && u.ev.ReceivedAt.Before(p.StuckBefore))
				s.Stuck = stuck && (u.alertedAt == nil || u.alertedAt.Before(now.Add(-StripeEventStuckReportEvery)))
				if !jobLive(s.JobState) {
					s.Requeued = true
					s.NewJobID, s.Err = l.stripeEventRerunTx(ctx, tx, &u.ev, s.JobState, p.Jobs)
					if s.Err != nil {
						s.Requeued = false
					}
				}
				if s.Stuck {
					if _, err := tx.Exec(ctx, `UPDATE billing.stripe_events SET stuck_alerted_at = $2 WHERE id = $1`, u.ev.ID, now); err != nil {
						return fmt.Errorf("error marking stripe event %s reported: %w", u.ev.ID, err)
					}
				}
				if s.Requeued || s.Stuck || s.Err != nil {
					found = append(found, s)
				}
			}
			return nil
		})
		if err != nil {
			return all, fmt.Errorf("error sweeping stripe events: %w", err)
		}
		all = append(all, found...)
		if len(page) < sweepPageSize || ctx.Err() != nil {
			return all, nil
		}
		cursor = &page[len(page)-1]
	}
}

// unfinishedEvent is a row of unfinishedEventsTx.
type unfinishedEvent struct {
	ev        StripeEvent
	alertedAt *time.Time
}

// unfinishedEventColumns are the columns of billing.stripe_events that
// scanUnfinishedEvent reads, in its order: stripeEventColumns without the
// payload (the sweep pages through many events and reads no payload), and
// when the event was last reported stuck.
const unfinishedEventColumns = `id, type, livemode, created_at, received_at, status, attempts, last_error,
       processed_at, job_id, stuck_alerted_at`

// scanUnfinishedEvent reads an unfinishedEvent from a row of
// unfinishedEventColumns; its event has no Payload.
func scanUnfinishedEvent(row pgx.Row) (unfinishedEvent, error) {
	var u unfinishedEvent
	if err := row.Scan(&u.ev.ID, &u.ev.Type, &u.ev.Livemode, &u.ev.CreatedAt, &u.ev.ReceivedAt, &u.ev.Status,
		&u.ev.Attempts, &u.ev.LastError, &u.ev.ProcessedAt, &u.ev.JobID, &u.alertedAt); err != nil {
		return unfinishedEvent{}, err
	}
	return u, nil
}

// unfinishedEventsTx returns the next page of events still received or
// failed that were received before receivedBefore, after cursor (nil: from
// the start), locked FOR NO KEY UPDATE; an event being processed now (locked
// by StripeEventHandle) is skipped.
func unfinishedEventsTx(ctx context.Context, tx *Tx, receivedBefore time.Time, cursor *unfinishedEvent) ([]unfinishedEvent, error) {
	var c unfinishedEvent
	if cursor != nil {
		c = *cursor
	}
	rows, err := tx.Query(ctx, `SELECT `+unfinishedEventColumns+`
FROM billing.stripe_events
WHERE status IN ('received', 'failed') AND received_at < $1
  AND ($2 OR (received_at, id) > ($3, $4))
ORDER BY received_at, id
LIMIT $5
FOR NO KEY UPDATE SKIP LOCKED`, receivedBefore, cursor == nil, c.ev.ReceivedAt, c.ev.ID, sweepPageSize)
	if err != nil {
		return nil, fmt.Errorf("error listing unfinished stripe events: %w", err)
	}
	page, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (unfinishedEvent, error) { return scanUnfinishedEvent(r) })
	if err != nil {
		return nil, fmt.Errorf("error listing unfinished stripe events: %w", err)
	}
	return page, nil
}

// stripeEventRerunTx makes the lost job of an event run again, in a savepoint
// so that a failure leaves the rest of the page alone, and returns the id of
// the job that runs: the recorded job when River still has it (finished),
// else a new one, recorded on the event.
func (l *Ledger) stripeEventRerunTx(ctx context.Context, tx *Tx, ev *StripeEvent, state string, jobs SweepJobs) (int64, error) {
	var jobID int64
	err := tx.savepoint(ctx, func(sp *Tx) error {
		if ev.JobID != nil && state != JobStateDeleted {
			jobID = *ev.JobID
			return jobs.JobRetryTx(ctx, sp, jobID)
		}
		if l.config.Scheduler == nil {
			return errors.New("ledger has no Scheduler")
		}
		var err error
		if jobID, err = l.config.Scheduler.StripeEventJobInsertTx(ctx, sp, ev.ID); err != nil {
			return err
		}
		_, err = sp.Exec(ctx, `UPDATE billing.stripe_events SET job_id = $2 WHERE id = $1`, ev.ID, jobID)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("error running job of stripe event %s again: %w", ev.ID, err)
	}
	return jobID, nil
}
