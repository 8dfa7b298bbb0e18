package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
)

// eventSweepBundle is a ledger with one stored Stripe event, evt_1, and its
// job (never worked: the River client inserts only).
func eventSweepBundle(t *testing.T) (context.Context, *testBundle, int64) {
	t.Helper()
	ctx, b := setup(t, setupOpts{noCustomer: true})
	created, err := b.Ledger.StripeEventRecord(ctx, ledger.StripeEventParams{
		ID: "evt_1", Type: "customer.created", Payload: []byte(`{"id":"evt_1","type":"customer.created"}`),
		CreatedAt: b.Clock.Now(),
	})
	require.NoError(t, err)
	require.True(t, created)
	ev, err := b.Ledger.StripeEventGet(ctx, "evt_1")
	require.NoError(t, err)
	return ctx, b, *ev.JobID
}

// sweepEvents advances the clock by d and sweeps as the sweep job does, with
// the default thresholds.
func sweepEvents(t *testing.T, ctx context.Context, b *testBundle, d time.Duration) []ledger.StripeEventSwept {
	t.Helper()
	b.Clock.Advance(d)
	now := b.Ledger.Now()
	swept, err := b.Ledger.StripeEventSweep(ctx, ledger.StripeEventSweepParams{
		ReceivedBefore: now.Add(-jobs.SweepAfterDefault),
		StuckAttempts:  jobs.StripeEventStuckAttemptsDefault,
		StuckBefore:    now.Add(-jobs.StripeEventStuckAfterDefault),
		Jobs:           jobs.Scheduler{Client: b.River},
	})
	require.NoError(t, err)
	return swept
}

func TestStripeEventSweep(t *testing.T) {
	t.Parallel()

	t.Run("CancelledJobRunsAgain", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := eventSweepBundle(t)
		setJobState(t, b, jobID, "cancelled")

		swept := sweepEvents(t, ctx, b, 16*time.Minute)
		require.Len(t, swept, 1)
		require.NoError(t, swept[0].Err)
		require.Equal(t, "evt_1", swept[0].Event.ID)
		require.Equal(t, "cancelled", swept[0].JobState)
		require.True(t, swept[0].Requeued)
		require.False(t, swept[0].Stuck, "not stuck yet: no attempt failed, received 16 minutes ago")
		require.Equal(t, jobID, swept[0].NewJobID)
		require.Equal(t, "available", jobState(t, b, jobID))

		require.Empty(t, sweepEvents(t, ctx, b, time.Minute), "its job is live again")
	})

	t.Run("DeletedJobIsInsertedAgain", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := eventSweepBundle(t)
		_, err := b.Pool.Exec(ctx, `DELETE FROM river.river_job WHERE id = $1`, jobID)
		require.NoError(t, err)

		swept := sweepEvents(t, ctx, b, 16*time.Minute)
		require.Len(t, swept, 1)
		require.Equal(t, ledger.JobStateDeleted, swept[0].JobState)
		require.True(t, swept[0].Requeued)
		require.NotEqual(t, jobID, swept[0].NewJobID)
		ev, err := b.Ledger.StripeEventGet(ctx, "evt_1")
		require.NoError(t, err)
		require.Equal(t, swept[0].NewJobID, *ev.JobID, "the new job is recorded on the event")
		require.Equal(t, "available", jobState(t, b, swept[0].NewJobID))
	})

	t.Run("DiscardedAfterFailuresIsStuckAndRunsAgain", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := eventSweepBundle(t)
		_, err := b.Pool.Exec(ctx, `UPDATE billing.stripe_events SET status = 'failed', attempts = 25, last_error = 'boom'`)
		require.NoError(t, err)
		setJobState(t, b, jobID, "discarded")

		swept := sweepEvents(t, ctx, b, 20*time.Minute)
		require.Len(t, swept, 1)
		require.True(t, swept[0].Requeued)
		require.True(t, swept[0].Stuck)
		require.Equal(t, "boom", *swept[0].Event.LastError)
		require.Equal(t, "available", jobState(t, b, jobID))
	})

	t.Run("FinishedEventIsLeftAlone", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := eventSweepBundle(t)
		_, err := b.Pool.Exec(ctx, `UPDATE billing.stripe_events SET status = 'processed', processed_at = now(), attempts = 1`)
		require.NoError(t, err)
		setJobState(t, b, jobID, "completed")

		require.Empty(t, sweepEvents(t, ctx, b, 2*time.Hour))
	})

	t.Run("RecentEventIsLeftAlone", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := eventSweepBundle(t)
		setJobState(t, b, jobID, "cancelled")

		require.Empty(t, sweepEvents(t, ctx, b, 10*time.Minute))
		require.Equal(t, "cancelled", jobState(t, b, jobID))
	})

	t.Run("StuckWhileRetryingIsReportedHourly", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := eventSweepBundle(t)
		_, err := b.Pool.Exec(ctx, `UPDATE billing.stripe_events SET status = 'failed', attempts = 5, last_error = 'boom'`)
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `UPDATE river.river_job SET state = 'retryable', attempt = 5, scheduled_at = now() + interval '1 hour' WHERE id = $1`, jobID)
		require.NoError(t, err)

		swept := sweepEvents(t, ctx, b, 16*time.Minute)
		require.Len(t, swept, 1)
		require.True(t, swept[0].Stuck)
		require.False(t, swept[0].Requeued, "River still retries it")
		require.Equal(t, "retryable", swept[0].JobState)
		require.Equal(t, "retryable", jobState(t, b, jobID))

		require.Empty(t, sweepEvents(t, ctx, b, 30*time.Minute), "reported at most once an hour")
		swept = sweepEvents(t, ctx, b, 31*time.Minute)
		require.Len(t, swept, 1)
		require.True(t, swept[0].Stuck)
	})

	t.Run("UnprocessedForAnHourIsStuck", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := eventSweepBundle(t)
		// Its job is live (available) but nothing works the queue.
		require.Empty(t, sweepEvents(t, ctx, b, 59*time.Minute))
		swept := sweepEvents(t, ctx, b, 2*time.Minute)
		require.Len(t, swept, 1)
		require.True(t, swept[0].Stuck)
		require.False(t, swept[0].Requeued)
		require.Equal(t, "available", swept[0].JobState)
	})
}
