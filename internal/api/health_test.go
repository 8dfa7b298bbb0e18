package api_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/api"
)

func TestHealthz(t *testing.T) {
	t.Parallel()

	t.Run("OpenAndOK", func(t *testing.T) {
		t.Parallel()
		b := setup(t.Context(), t)
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
		b := setup(t.Context(), t)
		var gotDeadline bool
		h := api.NewServer(b.Logger, b.Ledger, func(ctx context.Context) error {
			_, gotDeadline = ctx.Deadline()
			return errors.New("postgres unreachable: connection refused")
		}, "")
		rec := testServe(h, http.MethodGet, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		require.JSONEq(t, `{"status":"unavailable","error":"postgres unreachable: connection refused"}`, rec.Body.String())
		require.True(t, gotDeadline, "the readiness check is bounded")
	})

	t.Run("Ready", func(t *testing.T) {
		t.Parallel()
		b := setup(t.Context(), t)
		calls := 0
		h := api.NewServer(b.Logger, b.Ledger, func(ctx context.Context) error {
			calls++
			return nil
		}, "")
		rec := testServe(h, http.MethodGet, "/readyz")
		require.Equal(t, http.StatusOK, rec.Code)
		require.JSONEq(t, `{"status":"ok"}`, rec.Body.String())
		require.Equal(t, 1, calls)
	})
}
