package ledger_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
)

// novemberClosesAt is when the November 2026 period closes: month end plus
// the default 1 h grace.
var novemberClosesAt = time.Date(2026, 12, 1, 1, 0, 0, 0, time.UTC)

// sweepGrace is the sweep's grace in these tests (jobs.SweepAfterDefault).
const sweepGrace = 15 * time.Minute

// periodSweepBundle is a ledger with customer acme's November period open
// and its charge job inserted (never worked: the River client inserts only).
func periodSweepBundle(t *testing.T) (context.Context, *testBundle, int64) {
	t.Helper()
	ctx, b := setup(t, setupOpts{})
	_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "e1", AmountCents: 500})
	require.NoError(t, err)
	p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
	require.NoError(t, err)
	require.NotNil(t, p.ChargeJobID)
	return ctx, b, *p.ChargeJobID
}

// sweepPeriods moves the clock to now and sweeps as the sweep job does.
func sweepPeriods(t *testing.T, ctx context.Context, b *testBundle, now time.Time) []ledger.PeriodJobLost {
	t.Helper()
	b.Clock.Set(now)
	lost, err := b.Ledger.PeriodSweepLostJobs(ctx, ledger.PeriodSweepParams{
		ClosesBefore: b.Ledger.Now().Add(-sweepGrace), Jobs: jobs.Scheduler{Client: b.River},
	})
	require.NoError(t, err)
	return lost
}

// setJobState puts a River job in a finished state, as River leaves it after
// a discard or a cancel.
func setJobState(t *testing.T, b *testBundle, jobID int64, state string) {
	t.Helper()
	_, err := b.Pool.Exec(context.Background(), `
UPDATE river.river_job SET state = $2, finalized_at = now(), attempt = max_attempts WHERE id = $1`, jobID, state)
	require.NoError(t, err)
}

func jobState(t *testing.T, b *testBundle, jobID int64) string {
	t.Helper()
	var state string
	require.NoError(t, b.Pool.QueryRow(context.Background(), `SELECT state FROM river.river_job WHERE id = $1`, jobID).Scan(&state))
	return state
}

func TestPeriodSweepLostJobs(t *testing.T) {
	t.Parallel()

	wellPast := novemberClosesAt.Add(sweepGrace + time.Minute)

	t.Run("CancelledJobRunsAgain", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := periodSweepBundle(t)
		setJobState(t, b, jobID, "cancelled")

		lost := sweepPeriods(t, ctx, b, wellPast)
		require.Len(t, lost, 1)
		require.NoError(t, lost[0].Err)
		require.Equal(t, "acme", lost[0].CustomerID)
		require.Equal(t, "2026-11", lost[0].Period)
		require.True(t, novemberClosesAt.Equal(lost[0].ClosesAt))
		require.Equal(t, "cancelled", lost[0].JobState)
		require.Equal(t, jobID, *lost[0].JobID)
		require.Equal(t, jobID, lost[0].NewJobID)
		require.Equal(t, "available", jobState(t, b, jobID))

		require.Empty(t, sweepPeriods(t, ctx, b, wellPast.Add(time.Hour)), "a job that runs again is live")
	})

	t.Run("ClosedPeriodIsLeftAlone", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := periodSweepBundle(t)
		_, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
		require.NoError(t, err)
		setJobState(t, b, jobID, "completed")

		require.Empty(t, sweepPeriods(t, ctx, b, wellPast))
		require.Equal(t, "completed", jobState(t, b, jobID))
	})

	t.Run("DeletedJobIsInsertedAgain", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := periodSweepBundle(t)
		_, err := b.Pool.Exec(ctx, `DELETE FROM river.river_job WHERE id = $1`, jobID)
		require.NoError(t, err)

		lost := sweepPeriods(t, ctx, b, wellPast)
		require.Len(t, lost, 1)
		require.NoError(t, lost[0].Err)
		require.Equal(t, ledger.JobStateDeleted, lost[0].JobState)
		require.NotEqual(t, jobID, lost[0].NewJobID)
		p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
		require.NoError(t, err)
		require.Equal(t, lost[0].NewJobID, *p.ChargeJobID, "the new job is recorded on the period")
		require.Equal(t, "available", jobState(t, b, lost[0].NewJobID))
		require.Equal(t, int64(1), b.Count(t, `
SELECT count(*) FROM river.river_job
WHERE kind = 'charge_period' AND args->>'customer_id' = 'acme' AND args->>'period' = '2026-11'`))
	})

	t.Run("DiscardedJobRunsAgain", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := periodSweepBundle(t)
		setJobState(t, b, jobID, "discarded")

		lost := sweepPeriods(t, ctx, b, wellPast)
		require.Len(t, lost, 1)
		require.Equal(t, "discarded", lost[0].JobState)
		require.Equal(t, jobID, lost[0].NewJobID)
		require.Equal(t, "available", jobState(t, b, jobID))
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM river.river_job WHERE id = $1 AND max_attempts > attempt`, jobID),
			"the job has one more attempt")
	})

	t.Run("LiveJobIsLeftAlone", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := periodSweepBundle(t)
		before := jobState(t, b, jobID)

		require.Empty(t, sweepPeriods(t, ctx, b, wellPast.Add(24*time.Hour)))
		require.Equal(t, before, jobState(t, b, jobID))
	})

	t.Run("NoJobRecorded", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := periodSweepBundle(t)
		_, err := b.Pool.Exec(ctx, `UPDATE billing.periods SET charge_job_id = NULL`)
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `DELETE FROM river.river_job WHERE id = $1`, jobID)
		require.NoError(t, err)

		lost := sweepPeriods(t, ctx, b, wellPast)
		require.Len(t, lost, 1)
		require.Equal(t, ledger.JobStateNone, lost[0].JobState)
		require.Nil(t, lost[0].JobID)
		p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
		require.NoError(t, err)
		require.Equal(t, lost[0].NewJobID, *p.ChargeJobID)
	})

	t.Run("NotWellPastItsClose", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := periodSweepBundle(t)
		setJobState(t, b, jobID, "cancelled")

		require.Empty(t, sweepPeriods(t, ctx, b, novemberClosesAt.Add(sweepGrace-time.Minute)))
		require.Equal(t, "cancelled", jobState(t, b, jobID))
	})

	t.Run("PagesPastLiveJobs", func(t *testing.T) {
		t.Parallel()
		ctx, b, jobID := periodSweepBundle(t)
		// 600 open periods that closed before acme's: the first 550 name a
		// live job (acme's), the last 50 none. More than a page of live
		// ones must not hide the lost ones behind them.
		_, err := b.Pool.Exec(ctx, `
INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at)
SELECT 'c' || i, 'cus_c' || i, 'usd', now(), now() FROM generate_series(1, 600) i`)
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, charge_job_id, created_at)
SELECT 'c' || i, '2026-10', 'usd', '2026-10-01Z', '2026-11-01Z', '2026-11-01T01:00Z'::timestamptz + i * interval '1 second',
       CASE WHEN i <= 550 THEN $1::bigint END, now()
FROM generate_series(1, 600) i`, jobID)
		require.NoError(t, err)

		lost := sweepPeriods(t, ctx, b, wellPast)
		require.Len(t, lost, 50)
		for i, l := range lost {
			require.NoError(t, l.Err)
			require.Equal(t, ledger.JobStateNone, l.JobState)
			require.Equal(t, "c"+strconv.Itoa(551+i), l.CustomerID)
		}
		require.Equal(t, int64(50), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_period' AND args->>'period' = '2026-10'`))
		require.Empty(t, sweepPeriods(t, ctx, b, wellPast))
	})
}
