package ledger_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
)

// The kill switch's state is River's charge queue's, whoever paused or
// resumed it (River UI refuses to, but a River client or SQL can): the
// operator log's who and why are shown only when they agree with the queue,
// and a disagreement is said, in the state and in an alert.
func TestChargingFollowsTheQueue(t *testing.T) {
	t.Parallel()

	// discrepancy requires that the kill switch reads paused, with no one
	// on record and a discrepancy that says contains, that the operations
	// state (the metric's source) agrees, and that the report alerts.
	discrepancy := func(t *testing.T, b *testBundle, logs *syncBuffer, paused bool, contains string) {
		t.Helper()
		ctx := t.Context()
		st, err := b.Ledger.ChargingGet(ctx)
		require.NoError(t, err)
		require.Equal(t, paused, st.Paused)
		require.Empty(t, st.By, "no operator did it")
		require.Empty(t, st.Reason)
		require.Contains(t, st.Discrepancy, contains)
		require.Contains(t, st.Discrepancy, "billingctl charging")
		ops, err := b.Ledger.OperationsStateGet(ctx)
		require.NoError(t, err)
		require.Equal(t, paused, ops.ChargingPausedSince != nil, "the kill-switch metric's source")
		reported, err := b.Ledger.ChargingReport(ctx, ledger.ChargingPausedAlertAfter)
		require.NoError(t, err)
		require.True(t, reported)
		require.Contains(t, logs.String(), "alert=charging_discrepancy")
	}

	t.Run("PausedAgainOutsideTally", func(t *testing.T) {
		t.Parallel()
		ctx, b, logs := guardBundle(t, ledger.Config{})
		_, err := b.Ledger.ChargingPause(ctx, "operator:ops/tly_1", "incident 42")
		require.NoError(t, err)
		err = b.River.QueueResume(ctx, jobs.QueueCharges, nil)
		require.NoError(t, err)
		err = b.River.QueuePause(ctx, jobs.QueueCharges, nil)
		require.NoError(t, err)
		// The recorded pause is not this one: it was lifted in between.
		discrepancy(t, b, logs, true, "paused at")
	})

	t.Run("PausedOutsideTally", func(t *testing.T) {
		t.Parallel()
		ctx, b, logs := guardBundle(t, ledger.Config{})
		_, err := b.Pool.Exec(ctx, `
INSERT INTO river.river_queue (name, created_at, metadata, paused_at, updated_at)
VALUES ('charges', now(), '{}', now() - interval '1 minute', now())`)
		require.NoError(t, err)
		discrepancy(t, b, logs, true, "paused at")
		before, err := b.Ledger.ChargingGet(ctx)
		require.NoError(t, err)

		// An operator's pause records the pause that holds.
		st, err := b.Ledger.ChargingPause(ctx, "operator:ops/tly_1", "found paused")
		require.NoError(t, err)
		require.True(t, st.Paused)
		require.Equal(t, "operator:ops/tly_1", st.By)
		require.Empty(t, st.Discrepancy)
		require.True(t, before.Since.Equal(*st.Since), "River keeps the first pause's time")
	})

	t.Run("ResumedOutsideTally", func(t *testing.T) {
		t.Parallel()
		ctx, b, logs := guardBundle(t, ledger.Config{})
		st, err := b.Ledger.ChargingPause(ctx, "operator:ops/tly_1", "incident 42")
		require.NoError(t, err)
		require.Empty(t, st.Discrepancy)
		reported, err := b.Ledger.ChargingReport(ctx, ledger.ChargingPausedAlertAfter)
		require.NoError(t, err)
		require.False(t, reported, "just paused, as recorded")

		err = b.River.QueueResume(ctx, jobs.QueueCharges, nil)
		require.NoError(t, err)
		discrepancy(t, b, logs, false, `resumed outside Tally`)
		st, err = b.Ledger.ChargingGet(ctx)
		require.NoError(t, err)
		require.Nil(t, st.Since, "when it was resumed is not known")
		require.Contains(t, st.Discrepancy, `paused by operator:ops/tly_1 at `+ledgerNow(b)+` ("incident 42")`)

		// An operator's resume records it.
		st, err = b.Ledger.ChargingResume(ctx, "operator:ops/tly_1", "found resumed")
		require.NoError(t, err)
		require.False(t, st.Paused)
		require.Equal(t, "found resumed", st.Reason)
		require.Empty(t, st.Discrepancy)
	})
}

// ledgerNow is the test clock's time as the kill switch's messages show it.
func ledgerNow(b *testBundle) string { return b.Clock.Now().UTC().Format(time.RFC3339) }
