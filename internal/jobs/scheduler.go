package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/schema"
)

// Scheduler implements ledger.Scheduler with a River client, which may be
// insert-only.
type Scheduler struct {
	Client *river.Client[pgx.Tx]
}

// ChargeJobInsertTx inserts the charge_period job for (customerID, period) in
// tx, scheduled at runAt, and returns its id — the existing job's id when
// River's unique constraint finds one.
func (s Scheduler) ChargeJobInsertTx(ctx context.Context, tx pgx.Tx, customerID, period string, runAt time.Time) (int64, error) {
	res, err := s.Client.InsertTx(ctx, tx, ChargePeriodArgs{CustomerID: customerID, Period: period},
		&river.InsertOpts{ScheduledAt: runAt})
	if err != nil {
		return 0, fmt.Errorf("error inserting charge job %s/%s: %w", customerID, period, err)
	}
	return res.Job.ID, nil
}

// ChargeJobRunNowTx makes the job available at once in tx (River's
// JobRetryTx): a running job is left alone, a finished one runs again and
// finds its charge settled. When River has deleted the job (its retention of
// completed and discarded jobs), a new one is inserted to run now.
func (s Scheduler) ChargeJobRunNowTx(ctx context.Context, tx pgx.Tx, jobID int64, customerID, period string) (int64, error) {
	if jobID != 0 {
		_, err := s.Client.JobRetryTx(ctx, tx, jobID)
		if err == nil {
			return jobID, nil
		}
		if !errors.Is(err, rivertype.ErrNotFound) {
			return 0, fmt.Errorf("error making charge job %d run now: %w", jobID, err)
		}
	}
	res, err := s.Client.InsertTx(ctx, tx, ChargePeriodArgs{CustomerID: customerID, Period: period}, nil)
	if err != nil {
		return 0, fmt.Errorf("error inserting charge job %s/%s: %w", customerID, period, err)
	}
	return res.Job.ID, nil
}

// StripeEventJobInsertTx inserts the stripe_event job of a stored event in tx
// and returns its id.
func (s Scheduler) StripeEventJobInsertTx(ctx context.Context, tx pgx.Tx, eventID string) (int64, error) {
	res, err := s.Client.InsertTx(ctx, tx, StripeEventArgs{EventID: eventID}, nil)
	if err != nil {
		return 0, fmt.Errorf("error inserting job of stripe event %s: %w", eventID, err)
	}
	return res.Job.ID, nil
}

// WebhookDeliveryJobInsertTx inserts the webhook_delivery job of delivery
// deliveryID in tx and returns its id.
func (s Scheduler) WebhookDeliveryJobInsertTx(ctx context.Context, tx pgx.Tx, deliveryID int64) (int64, error) {
	res, err := s.Client.InsertTx(ctx, tx, WebhookDeliveryArgs{DeliveryID: deliveryID}, nil)
	if err != nil {
		return 0, fmt.Errorf("error inserting job of webhook delivery %d: %w", deliveryID, err)
	}
	return res.Job.ID, nil
}

// ChargeResolveJobInsertTx inserts the charge_resolve job of an operator's
// resolve in tx and returns its id.
func (s Scheduler) ChargeResolveJobInsertTx(ctx context.Context, tx pgx.Tx, p ledger.ChargeResolveJob) (int64, error) {
	res, err := s.Client.InsertTx(ctx, tx, ChargeResolveArgs(p), nil)
	if err != nil {
		return 0, fmt.Errorf("error inserting resolve job of charge %d: %w", p.ChargeID, err)
	}
	return res.Job.ID, nil
}

// ChargingPausedTx returns since when QueueCharges is paused, or nil.
func (s Scheduler) ChargingPausedTx(ctx context.Context, tx pgx.Tx) (*time.Time, error) {
	q, err := s.Client.QueueGetTx(ctx, tx, QueueCharges)
	if errors.Is(err, rivertype.ErrNotFound) {
		return nil, nil // no worker has started yet: not paused
	}
	if err != nil {
		return nil, fmt.Errorf("error reading queue %s: %w", QueueCharges, err)
	}
	return q.PausedAt, nil
}

// ChargingPauseTx pauses QueueCharges on every client (River's queue pause,
// persisted in river_queue), creating the queue's row when no worker has
// started yet so the pause holds from their first start.
func (s Scheduler) ChargingPauseTx(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `
INSERT INTO `+schema.RiverSchema+`.river_queue (name, created_at, metadata, updated_at)
VALUES ($1, now(), '{}', now()) ON CONFLICT (name) DO NOTHING`, QueueCharges); err != nil {
		return fmt.Errorf("error creating queue %s: %w", QueueCharges, err)
	}
	if err := s.Client.QueuePauseTx(ctx, tx, QueueCharges, nil); err != nil {
		return fmt.Errorf("error pausing queue %s: %w", QueueCharges, err)
	}
	return nil
}

// ChargingResumeTx resumes QueueCharges on every client.
func (s Scheduler) ChargingResumeTx(ctx context.Context, tx pgx.Tx) error {
	err := s.Client.QueueResumeTx(ctx, tx, QueueCharges, nil)
	if err != nil && !errors.Is(err, rivertype.ErrNotFound) {
		return fmt.Errorf("error resuming queue %s: %w", QueueCharges, err)
	}
	return nil
}

// TopUpJobInsertTx inserts the top_up job of (customerID, topUpID) in tx and
// returns its id — the existing job's when River's unique constraint finds
// one.
func (s Scheduler) TopUpJobInsertTx(ctx context.Context, tx pgx.Tx, customerID, topUpID string) (int64, error) {
	res, err := s.Client.InsertTx(ctx, tx, TopUpArgs{CustomerID: customerID, TopUpID: topUpID}, nil)
	if err != nil {
		return 0, fmt.Errorf("error inserting top-up job %s/%s: %w", customerID, topUpID, err)
	}
	return res.Job.ID, nil
}

// TopUpJobRunNowTx makes the top-up's job available at once in tx, as
// ChargeJobRunNowTx does a charge's.
func (s Scheduler) TopUpJobRunNowTx(ctx context.Context, tx pgx.Tx, jobID int64, customerID, topUpID string) (int64, error) {
	if jobID != 0 {
		_, err := s.Client.JobRetryTx(ctx, tx, jobID)
		if err == nil {
			return jobID, nil
		}
		if !errors.Is(err, rivertype.ErrNotFound) {
			return 0, fmt.Errorf("error making top-up job %d run now: %w", jobID, err)
		}
	}
	return s.TopUpJobInsertTx(ctx, tx, customerID, topUpID)
}
