package api

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// readyTimeout bounds one readiness check.
const readyTimeout = 3 * time.Second

// handleHealthz answers 200 while the process runs.
func handleHealthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		encode(w, http.StatusOK, map[string]string{"status": "ok"})
	})
}

// handleReadyz answers 200 when ready reports no error, else 503 with the
// reason (which holds no secrets: it names the failing dependency).
func handleReadyz(logger *slog.Logger, ready ReadyFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			logger.WarnContext(ctx, "not ready", slog.String("error", err.Error()))
			encode(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": err.Error()})
			return
		}
		encode(w, http.StatusOK, map[string]string{"status": "ok"})
	})
}
