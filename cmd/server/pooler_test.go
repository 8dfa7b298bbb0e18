package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/postgres"
	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/pgbouncer"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// poolerWaitMax bounds the wait for the charges made through the pooler.
const poolerWaitMax = 60 * time.Second

// startPooler starts a PgBouncer in transaction mode with poolSize server
// connections in front of databaseURL's server, stopped when the test ends,
// and returns it with databaseURL through it.
func startPooler(t *testing.T, databaseURL string, poolSize int) (*pgbouncer.Bouncer, string) {
	t.Helper()
	b, err := pgbouncer.Start(t.Context(), pgbouncer.Config{Dir: filepath.Join(t.TempDir(), "pgbouncer"), Backend: databaseURL, PoolSize: poolSize})
	require.NoError(t, err)
	t.Cleanup(b.Stop)
	poolerURL, err := b.URL(databaseURL)
	require.NoError(t, err)
	return b, poolerURL
}

// TestPooler runs Tally's API and worker pools through PgBouncer in
// transaction mode (TALLY_POOLER_URL), with fewer server connections than
// the pools have clients, so that consecutive transactions of one client
// land on different server connections: single events in groups, a batch,
// replays and a conflict, closes and charges through Stripe, all exactly
// once.
func TestPooler(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	// Named prepared statements do not survive a pooler in transaction
	// mode: two clients sharing one server connection prepare the same
	// statement name on it. ConnectPooled prepares none.
	t.Run("NamedStatementsFailUnnamedWork", func(t *testing.T) {
		t.Parallel()
		_, databaseURL := testdb.New(t)
		_, poolerURL := startPooler(t, databaseURL, 1)

		run := func(connect func(context.Context, string, string, int32) (*pgxpool.Pool, error)) error {
			pool, err := connect(ctx, poolerURL, "tally-pooler-test", 2)
			require.NoError(t, err)
			defer pool.Close()
			// Two connections of the pool, each running the statement in
			// turn: both go through the pooler's one server connection.
			c1, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer c1.Release()
			c2, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer c2.Release()
			for range 3 {
				for _, c := range []*pgxpool.Conn{c1, c2} {
					var n int
					if err := c.QueryRow(ctx, `SELECT count(*)::int FROM billing.customers WHERE customer_id <> $1`, "x").Scan(&n); err != nil {
						return err
					}
				}
			}
			return nil
		}
		err := run(postgres.Connect)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "named prepared statements through a pooler in transaction mode")
		require.Contains(t, []string{"42P05", "26000"}, pgErr.Code, "prepared statement already exists, or does not exist: %v", err)
		require.NoError(t, run(postgres.ConnectPooled))
	})

	t.Run("EventsAndChargesExactlyOnce", func(t *testing.T) {
		t.Parallel()
		pool, databaseURL := testdb.New(t)
		bouncer, poolerURL := startPooler(t, databaseURL, 3)

		sim := stripesim.New(stripesim.Config{})
		t.Cleanup(sim.Close)
		simSrv := httptest.NewServer(sim)
		t.Cleanup(simSrv.Close)

		srv := setupEnv(ctx, t, databaseURL, map[string]string{
			"TALLY_POOLER_URL":          poolerURL,
			"TALLY_ROLES":               "api,worker",
			"TALLY_WORKERS":             "8",
			"TALLY_API_DB_MAX_CONNS":    "8",
			"TALLY_WORKER_DB_MAX_CONNS": "8",
			"STRIPE_API_KEY":            "sk_test_pooler",
			"STRIPE_API_BASE":           simSrv.URL,
			"STRIPE_TIMEOUT":            "5s",
		})
		srv.waitStatus(t, "/readyz", http.StatusOK)

		l, err := ledger.New(pool, ledger.Config{})
		require.NoError(t, err)
		key, _, err := l.APIKeyCreate(ctx, "pooler", ledger.Scopes)
		require.NoError(t, err)

		customers := []string{"acme", "globex", "initech"}
		for _, c := range customers {
			status, _, body := srv.call(t, key, http.MethodPut, "/v1/customers/"+c, `{"stripe_customer_id":"cus_`+c+`","currency":"usd"}`)
			require.Equal(t, http.StatusCreated, status, "body: %s", body)
		}

		// Single events from 12 clients at once (written in groups), each
		// posted twice: the second is a replay.
		want := map[string]int64{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, 12)
		for w := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 10 {
					c := customers[(w+i)%len(customers)]
					amount := int64(100 + w*10 + i)
					body := fmt.Sprintf(`{"customer_id":%q,"event_id":"s-%d-%d","amount_cents":%d}`, c, w, i, amount)
					for attempt, wantStatus := range []int{http.StatusCreated, http.StatusOK} {
						status, _, out := srv.call(t, key, http.MethodPost, "/v1/usage-events", body)
						if status != wantStatus {
							errs <- fmt.Errorf("event s-%d-%d, post %d: %d %s", w, i, attempt+1, status, out)
							return
						}
					}
					mu.Lock()
					want[c] += amount
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}

		// A batch of 90, then the same batch again (all replays), then an
		// event that reuses a key with another amount (a conflict).
		var items []string
		for i := range 90 {
			c := customers[i%len(customers)]
			items = append(items, fmt.Sprintf(`{"customer_id":%q,"event_id":"b-%d","amount_cents":%d}`, c, i, 1000+i))
			want[c] += int64(1000 + i)
		}
		batch := `{"events":[` + strings.Join(items, ",") + `]}`
		for _, wantCreated := range []int{90, 0} {
			status, _, out := srv.call(t, key, http.MethodPost, "/v1/usage-events/batch", batch)
			require.Equal(t, map[bool]int{true: http.StatusCreated, false: http.StatusOK}[wantCreated > 0], status, "body: %s", out)
			var res struct{ Created, Replayed int }
			require.NoError(t, json.Unmarshal(out, &res))
			require.Equal(t, wantCreated, res.Created)
			require.Equal(t, 90-wantCreated, res.Replayed)
		}
		status, _, out := srv.call(t, key, http.MethodPost, "/v1/usage-events", `{"customer_id":"acme","event_id":"b-0","amount_cents":1}`)
		require.Equal(t, http.StatusConflict, status, "body: %s", out)

		// Close each period now; the workers charge them through Stripe.
		var period string
		require.NoError(t, pool.QueryRow(ctx, `SELECT period FROM billing.periods WHERE customer_id = 'acme'`).Scan(&period))
		for _, c := range customers {
			status, _, out := srv.call(t, key, http.MethodPost, "/v1/customers/"+c+"/periods/"+period+"/close", "")
			require.Equal(t, http.StatusOK, status, "body: %s", out)
		}
		deadline := time.Now().Add(poolerWaitMax)
		for {
			var succeeded int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*)::int FROM billing.charges WHERE status = 'succeeded'`).Scan(&succeeded))
			if succeeded == len(customers) {
				break
			}
			require.True(t, time.Now().Before(deadline), "charges through the pooler never all succeeded\nstdout: %s", srv.stdout)
			time.Sleep(100 * time.Millisecond)
		}
		pis := map[string][]int64{}
		for _, pi := range sim.PaymentIntentList() {
			pis[pi.Customer.ID] = append(pis[pi.Customer.ID], pi.Amount)
		}
		for _, c := range customers {
			var amount, events int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT amount_cents, event_count FROM billing.charges WHERE customer_id = $1`, c).Scan(&amount, &events))
			require.Equal(t, want[c], amount, "charge of %s", c)
			require.Equal(t, int64(40+30), events, "events of %s", c)
			require.Equal(t, []int64{want[c]}, pis["cus_"+c], "one PaymentIntent of the ledger's amount for %s", c)
		}

		// The pools did go through the pooler: it counted their
		// transactions on the test's database.
		consoleURL, err := url.Parse(poolerURL)
		require.NoError(t, err)
		dbName := strings.TrimPrefix(consoleURL.Path, "/")
		consoleURL.Path = "/pgbouncer" // the pooler's admin console
		admin, err := pgx.Connect(ctx, consoleURL.String())
		require.NoError(t, err)
		rows, err := admin.Query(ctx, "SHOW STATS", pgx.QueryExecModeSimpleProtocol)
		require.NoError(t, err)
		stats, err := pgx.CollectRows(rows, pgx.RowToMap)
		require.NoError(t, err)
		var xacts int64
		for _, s := range stats {
			if s["database"] == dbName {
				n, ok := s["total_xact_count"].(pgtype.Numeric)
				require.True(t, ok, "total_xact_count: %T", s["total_xact_count"])
				v, err := n.Int64Value()
				require.NoError(t, err)
				xacts = v.Int64
			}
		}
		// 240 posts of single events (grouped), 3 batches, closes, claims
		// and outcomes: a direct connection would leave this at 0.
		require.Greater(t, xacts, int64(50), "transactions through the pooler: %v", stats)

		// With the pooler gone, a request is answered 503 with Retry-After
		// (send it again), not 500, and nothing is acknowledged.
		admin.Close(ctx)
		bouncer.Stop()
		status, header, out := srv.call(t, key, http.MethodPost, "/v1/usage-events", `{"customer_id":"acme","event_id":"late","amount_cents":1}`)
		require.Equal(t, http.StatusServiceUnavailable, status, "body: %s", out)
		require.Equal(t, "1", header.Get("Retry-After"))
		require.Contains(t, string(out), `"code":"database_unavailable"`)
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*)::int FROM billing.usage_events WHERE event_id = 'late'`).Scan(&n))
		require.Zero(t, n)
	})
}
