package main

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

func TestPools(t *testing.T) {
	t.Parallel()

	// A replica with both roles opens two pools, each with its own
	// application_name and size: a flood of ingest fills the API's pool and
	// never reaches past it, and the workers keep their own connections.
	t.Run("APIAndWorkersHaveSeparatePools", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool, databaseURL := testdb.New(t)
		b := setupEnv(ctx, t, databaseURL, map[string]string{
			"TALLY_ROLES":               "api,worker",
			"STRIPE_API_KEY":            "rk_test_pools",
			"STRIPE_API_BASE":           "http://127.0.0.1:1", // no job calls it here
			"TALLY_API_DB_MAX_CONNS":    "2",
			"TALLY_WORKER_DB_MAX_CONNS": "4",
		})
		b.waitStatus(t, "/readyz", http.StatusOK)

		l, err := ledger.New(pool, ledger.Config{})
		require.NoError(t, err)
		secret, _, err := l.APIKeyCreate(ctx, "flood", ledger.Scopes)
		require.NoError(t, err)
		status, _, body := b.call(t, secret, http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd"}`)
		require.Equal(t, http.StatusCreated, status, "body: %s", body)

		// connections returns the test database's sessions by application_name.
		connections := func() map[string]int {
			rows, err := pool.Query(ctx, `
SELECT application_name, count(*)::int FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'tally-server%'
GROUP BY 1`)
			require.NoError(t, err)
			defer rows.Close()
			m := map[string]int{}
			for rows.Next() {
				var name string
				var n int
				require.NoError(t, rows.Scan(&name, &n))
				m[name] = n
			}
			require.NoError(t, rows.Err())
			return m
		}

		// Flood the API while sampling the sessions.
		var maxAPI, maxWorker atomic.Int64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				m := connections()
				if int64(m[appNameAPI]) > maxAPI.Load() {
					maxAPI.Store(int64(m[appNameAPI]))
				}
				if int64(m[appNameWorker]) > maxWorker.Load() {
					maxWorker.Store(int64(m[appNameWorker]))
				}
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		var wg sync.WaitGroup
		var created atomic.Int64
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, _, _ := b.call(t, secret, http.MethodPost, "/v1/usage-events",
					fmt.Sprintf(`{"customer_id":"acme","event_id":"e%d","amount_cents":1}`, i))
				if status == http.StatusCreated {
					created.Add(1)
				}
			}()
		}
		wg.Wait()
		close(stop)
		<-sampled

		require.Equal(t, int64(64), created.Load())
		m := connections()
		require.Positive(t, m[appNameAPI], "the API's pool has its own application_name: %v", m)
		require.Positive(t, m[appNameWorker], "the workers' pool has its own application_name: %v", m)
		require.LessOrEqual(t, maxAPI.Load(), int64(2), "the API's pool stays within TALLY_API_DB_MAX_CONNS")
		// River's notifier takes one connection out of the pool for LISTEN
		// (riverpgxv5 hijacks it), so the pool may open one more.
		require.LessOrEqual(t, maxWorker.Load(), int64(4+1), "the workers' pool stays within TALLY_WORKER_DB_MAX_CONNS (+ the notifier's)")
		b.waitStatus(t, "/readyz", http.StatusOK)
		b.stop(t)
	})

	t.Run("OneRoleOnePool", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool, databaseURL := testdb.New(t)
		b := setup(ctx, t, databaseURL) // TALLY_ROLES=api
		b.waitStatus(t, "/readyz", http.StatusOK)
		var api, worker int
		require.NoError(t, pool.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE application_name = $1)::int, count(*) FILTER (WHERE application_name = $2)::int
FROM pg_stat_activity WHERE datname = current_database()`, appNameAPI, appNameWorker).Scan(&api, &worker))
		require.Positive(t, api)
		require.Zero(t, worker, "an API-only replica opens no worker pool")
		b.stop(t)
	})

	t.Run("DeprecatedVariableWarns", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		_, databaseURL := testdb.New(t)
		b := setupEnv(ctx, t, databaseURL, map[string]string{"TALLY_DB_MAX_CONNS": "3"})
		b.waitStatus(t, "/readyz", http.StatusOK)
		b.stop(t)
		require.Contains(t, b.stdout.String(), `TALLY_DB_MAX_CONNS is deprecated`)
		require.Contains(t, b.stdout.String(), `"api_db_max_conns":3`)
	})
}
