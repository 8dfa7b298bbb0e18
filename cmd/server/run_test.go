package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// Bounds on waiting for the program, so a broken start or shutdown fails the
// test instead of hanging it. They are limits, not assertions on duration.
const (
	readyWaitMax    = 20 * time.Second
	shutdownWaitMax = 30 * time.Second
)

// syncBuffer is a bytes.Buffer safe for the server's goroutines to write
// while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testBundle is a running server.
type testBundle struct {
	baseURL string
	cancel  context.CancelFunc
	runErr  chan error
	stdout  *syncBuffer
	stderr  *syncBuffer
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// setup starts run with an API-only environment on databaseURL and returns
// without waiting for readiness. The server is stopped when the test ends.
func setup(ctx context.Context, t *testing.T, databaseURL string) *testBundle {
	t.Helper()
	return setupEnv(ctx, t, databaseURL, nil)
}

// setupEnv is setup with extra variables, which override the API-only
// environment.
func setupEnv(ctx context.Context, t *testing.T, databaseURL string, extra map[string]string) *testBundle {
	t.Helper()
	addr := freeAddr(t)
	env := map[string]string{
		"DATABASE_URL":    databaseURL,
		"TALLY_HTTP_ADDR": addr, "TALLY_METRICS_ADDR": "off",
		"TALLY_ROLES":  "api",
		"TALLY_PERIOD": "day",
	}
	for k, v := range extra {
		env[k] = v
	}
	ctx, cancel := context.WithCancel(ctx)
	b := &testBundle{
		baseURL: "http://" + addr,
		cancel:  cancel,
		runErr:  make(chan error, 1),
		stdout:  &syncBuffer{},
		stderr:  &syncBuffer{},
	}
	go func() {
		b.runErr <- run(ctx, []string{"server"}, func(k string) string { return env[k] }, b.stdout, b.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-b.runErr:
			if err != nil {
				t.Logf("run returned: %v", err)
			}
		case <-time.After(shutdownWaitMax):
			t.Errorf("run did not return after cancel")
		}
	})
	return b
}

// waitStatus polls path until it answers want, run returns, or the wait
// bound passes.
func (b *testBundle) waitStatus(t *testing.T, path string, want int) {
	t.Helper()
	deadline := time.Now().Add(readyWaitMax)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case err := <-b.runErr:
			b.runErr <- err // for Cleanup
			require.FailNow(t, "run returned before "+path+" answered", "error: %v\nstdout: %s", err, b.stdout)
		default:
		}
		resp, err := http.Get(b.baseURL + path)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.FailNow(t, path+" never answered as wanted", "want %d; last: %s\nstdout: %s", want, last, b.stdout)
}

// stop cancels run's context and requires it to return nil.
func (b *testBundle) stop(t *testing.T) {
	t.Helper()
	b.cancel()
	select {
	case err := <-b.runErr:
		b.runErr <- err // for Cleanup
		require.NoError(t, err, "stdout: %s", b.stdout)
	case <-time.After(shutdownWaitMax):
		require.FailNow(t, "run did not return after its context was canceled")
	}
}

// call sends a JSON request with the bearer secret and returns the status,
// headers and body.
func (b *testBundle) call(t *testing.T, secret, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, b.baseURL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+secret)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, out
}

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("AddressInUse", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		_, databaseURL := testdb.New(t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		env := map[string]string{"DATABASE_URL": databaseURL, "TALLY_HTTP_ADDR": ln.Addr().String(), "TALLY_METRICS_ADDR": "off", "TALLY_ROLES": "api"}
		err = run(ctx, []string{"server"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
		require.ErrorContains(t, err, "TALLY_HTTP_ADDR")
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{"TALLY_ROLES": "api", "TALLY_PERIOD": "week"}
		err := run(t.Context(), []string{"server"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
		require.ErrorContains(t, err, "DATABASE_URL")
		require.ErrorContains(t, err, "TALLY_PERIOD")
	})

	t.Run("NotReadyOnUnmigratedDatabase", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t, testdb.NewEmpty(t))
		b.waitStatus(t, "/healthz", http.StatusOK)
		b.waitStatus(t, "/readyz", http.StatusServiceUnavailable)
		b.stop(t)
	})

	t.Run("ReadinessCheckWritesNothing", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		databaseURL := testdb.NewEmpty(t)
		conn, err := pgx.Connect(ctx, databaseURL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		_, err = conn.Exec(ctx, "CREATE SCHEMA billing")
		require.NoError(t, err)

		b := setup(ctx, t, databaseURL)
		b.waitStatus(t, "/readyz", http.StatusServiceUnavailable)
		b.stop(t)

		var table *string
		require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass('billing.goose_db_version')::text").Scan(&table))
		require.Nil(t, table, "the readiness probe created goose's version table")
	})

	t.Run("ServesAndShutsDownGracefully", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool, databaseURL := testdb.New(t)
		b := setup(ctx, t, databaseURL)
		b.waitStatus(t, "/readyz", http.StatusOK)

		l, err := ledger.New(pool, ledger.Config{})
		require.NoError(t, err)
		secret, _, err := l.APIKeyCreate(ctx, "e2e", ledger.Scopes)
		require.NoError(t, err)

		status, _, body := b.call(t, secret, http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd"}`)
		require.Equal(t, http.StatusCreated, status, "body: %s", body)

		event := `{"customer_id":"acme","event_id":"e1","amount_cents":1250,"metric":"api_calls"}`
		status, header, first := b.call(t, secret, http.MethodPost, "/v1/usage-events", event)
		require.Equal(t, http.StatusCreated, status, "body: %s", first)
		require.NotEmpty(t, header.Get("X-Request-Id"))
		status, header, again := b.call(t, secret, http.MethodPost, "/v1/usage-events", event)
		require.Equal(t, http.StatusOK, status, "body: %s", again)
		require.Equal(t, "true", header.Get("Idempotent-Replayed"))
		require.Equal(t, string(first), string(again))

		var ev struct {
			Period string `json:"period"`
		}
		require.NoError(t, json.Unmarshal(first, &ev))
		_, err = time.Parse("2006-01-02", ev.Period)
		require.NoError(t, err, "TALLY_PERIOD=day gives daily labels: %q", ev.Period)

		status, _, body = b.call(t, secret, http.MethodGet, "/v1/customers/acme/periods/"+ev.Period, "")
		require.Equal(t, http.StatusOK, status, "body: %s", body)
		var period struct {
			Status     string `json:"status"`
			EventCount int64  `json:"event_count"`
			TotalCents int64  `json:"total_cents"`
		}
		require.NoError(t, json.Unmarshal(body, &period))
		require.Equal(t, "open", period.Status)
		require.Equal(t, int64(1), period.EventCount)
		require.Equal(t, int64(1250), period.TotalCents)

		status, _, body = b.call(t, "tly_wrong", http.MethodGet, "/v1/customers/acme", "")
		require.Equal(t, http.StatusUnauthorized, status, "body: %s", body)

		b.stop(t)

		resp, err := http.Get(b.baseURL + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		var opErr *net.OpError
		require.True(t, errors.As(err, &opErr), "the listener is closed after run returns: %v", err)

		logs := b.stdout.String()
		require.Contains(t, logs, `"msg":"listening"`)
		require.Contains(t, logs, `"msg":"request"`)
		require.Contains(t, logs, `"msg":"stopped"`)
		require.NotContains(t, logs, secret, "the API key secret must never be logged")
		require.NotContains(t, logs, secret[15:], "the API key secret must never be logged")
	})
}

func TestReadiness(t *testing.T) {
	t.Parallel()

	// readyz reads /readyz once and returns its status and body.
	readyz := func(t *testing.T, b *testBundle) (int, string) {
		t.Helper()
		resp, err := http.Get(b.baseURL + "/readyz")
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}

	t.Run("DatabaseDownIsGeneric", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		// Nothing listens on the port: every connection attempt fails.
		down := "postgres://tally_reader:hunter2@" + freeAddr(t) + "/secret_db?sslmode=disable&connect_timeout=1"
		b := setup(ctx, t, down)
		b.waitStatus(t, "/readyz", http.StatusServiceUnavailable)
		status, body := readyz(t, b)
		require.Equal(t, http.StatusServiceUnavailable, status)
		require.JSONEq(t, `{"status":"unavailable","reason":"database"}`, body)
		b.stop(t)

		logs := b.stdout.String()
		require.Contains(t, logs, `"msg":"not ready"`)
		require.Contains(t, logs, `"reason":"database"`)
		require.Contains(t, logs, `"level":"WARN"`)
		require.Contains(t, logs, "postgres unreachable", "the detail is logged")
		require.NotContains(t, logs, "hunter2", "the database password is never logged")
	})

	t.Run("MigrationsPendingIsGeneric", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t, testdb.NewEmpty(t))
		b.waitStatus(t, "/readyz", http.StatusServiceUnavailable)
		status, body := readyz(t, b)
		require.Equal(t, http.StatusServiceUnavailable, status)
		require.JSONEq(t, `{"status":"unavailable","reason":"migrations pending"}`, body)
		b.stop(t)
		require.Contains(t, b.stdout.String(), "run migrate up", "the detail is logged")
	})
}
