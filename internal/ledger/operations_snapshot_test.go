package ledger_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// TestOperationsSnapshotGet holds the shared snapshot of the state gauges to
// one take per interval whatever the number of replicas (ledgers on the same
// database).
func TestOperationsSnapshotGet(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{noCustomer: true})
	var takes atomic.Int64
	take := func(context.Context) (json.RawMessage, error) {
		n := takes.Add(1)
		return json.RawMessage(`{"take":` + strconv.FormatInt(n, 10) + `}`), nil
	}
	replica := func() *ledger.Ledger {
		l, err := ledger.New(b.Pool, ledger.Config{Logger: b.Logger})
		require.NoError(t, err)
		return l
	}

	first, err := b.Ledger.OperationsSnapshotGet(ctx, time.Hour, take)
	require.NoError(t, err)
	require.JSONEq(t, `{"take":1}`, string(first.State))

	// In this order (by name too): they share one snapshot and count its takes, 1, 2 then 3.
	t.Run("FreshIsShared", func(t *testing.T) {
		for range 3 {
			snap, err := replica().OperationsSnapshotGet(ctx, time.Hour, take)
			require.NoError(t, err)
			require.JSONEq(t, `{"take":1}`, string(snap.State))
			require.True(t, snap.TakenAt.Equal(first.TakenAt))
			require.False(t, snap.Now.Before(snap.TakenAt))
		}
		require.Equal(t, int64(1), takes.Load())
	})

	t.Run("StaleIsTakenOnceByManyReplicas", func(t *testing.T) {
		_, err := b.Pool.Exec(ctx, `UPDATE billing.operations_snapshot SET taken_at = taken_at - interval '2 hours'`)
		require.NoError(t, err)
		before := takes.Load()
		slow := func(ctx context.Context) (json.RawMessage, error) {
			time.Sleep(200 * time.Millisecond) // the others arrive while it is taken
			return take(ctx)
		}
		var wg sync.WaitGroup
		states := make([]string, 8)
		for i := range states {
			wg.Add(1)
			go func() {
				defer wg.Done()
				snap, err := replica().OperationsSnapshotGet(ctx, time.Hour, slow)
				if err == nil {
					states[i] = string(snap.State)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, before+1, takes.Load(), "one replica took it")
		for _, s := range states {
			// The taker's, or the stale one answered while it was taken.
			var st struct{ Take int }
			require.NoError(t, json.Unmarshal([]byte(s), &st), s)
			require.Contains(t, []int{1, 2}, st.Take)
		}
		var stored string
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT state::text FROM billing.operations_snapshot`).Scan(&stored))
		require.Equal(t, `{"take": 2}`, stored)
	})

	t.Run("TakenAgainPastMaxAge", func(t *testing.T) {
		before := takes.Load()
		snap, err := replica().OperationsSnapshotGet(ctx, 0, take)
		require.NoError(t, err)
		require.Equal(t, before+1, takes.Load())
		require.JSONEq(t, `{"take":3}`, string(snap.State))
		require.True(t, snap.TakenAt.After(first.TakenAt))
	})
}
