package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/api"
)

func TestHealthz(t *testing.T) {
	t.Parallel()

	t.Run("OpenAndOK", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodGet, "/healthz", "")
		req.Header.Del("Authorization")
		rec := b.serve(req)
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		require.JSONEq(t, `{"status":"ok"}`, rec.Body.String())
	})
}

func TestReadyz(t *testing.T) {
	t.Parallel()

	t.Run("NotReady", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		var gotDeadline bool
		var logs bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&logs, nil))
		h := newServer(t, logger, b.Ledger, func(ctx context.Context) error {
			_, gotDeadline = ctx.Deadline()
			return &api.NotReadyError{Reason: api.ReadyReasonDatabase,
				Err: errors.New("postgres unreachable: failed to connect to `user=tally database=billing_prod`: 10.0.0.7:5432: connection refused")}
		}, "")
		rec := testServe(h, http.MethodGet, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		require.JSONEq(t, `{"status":"unavailable","reason":"database"}`, rec.Body.String())
		require.True(t, gotDeadline, "the readiness check is bounded")

		// The detail is logged with the request id, never answered.
		require.Contains(t, logs.String(), `"level":"WARN"`)
		require.Contains(t, logs.String(), `"msg":"not ready"`)
		require.Contains(t, logs.String(), `"reason":"database"`)
		require.Contains(t, logs.String(), "10.0.0.7:5432")
		require.Contains(t, logs.String(), `"request_id":"`+rec.Header().Get("X-Request-Id")+`"`)
	})

	t.Run("NotReadyReasons", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, tc := range []struct {
			err  error
			want string
		}{
			{&api.NotReadyError{Reason: api.ReadyReasonMigrations, Err: errors.New("tally migrations at version 6, want 8: run migrate up")}, "migrations pending"},
			{&api.NotReadyError{Reason: api.ReadyReasonWorkers, Err: errors.New("river workers stopped")}, "workers stopped"},
			{fmt.Errorf("wrapped: %w", &api.NotReadyError{Reason: api.ReadyReasonDatabase, Err: errors.New("x")}), "database"},
			{errors.New("password authentication failed for user \"tally\""), "unknown"},
		} {
			h := newServer(t, b.Logger, b.Ledger, func(ctx context.Context) error { return tc.err }, "")
			rec := testServe(h, http.MethodGet, "/readyz")
			require.Equal(t, http.StatusServiceUnavailable, rec.Code)
			require.JSONEq(t, `{"status":"unavailable","reason":"`+tc.want+`"}`, rec.Body.String())
		}
	})

	t.Run("Ready", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		calls := 0
		h := newServer(t, b.Logger, b.Ledger, func(ctx context.Context) error {
			calls++
			return nil
		}, "")
		rec := testServe(h, http.MethodGet, "/readyz")
		require.Equal(t, http.StatusOK, rec.Code)
		require.JSONEq(t, `{"status":"ok"}`, rec.Body.String())
		require.Equal(t, 1, calls)
	})
}
