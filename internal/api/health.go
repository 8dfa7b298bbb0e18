package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
)

// readyTimeout bounds one readiness check.
const readyTimeout = 3 * time.Second

// Reasons /readyz gives for not being ready; see NotReadyError.
const (
	ReadyReasonDatabase   = "database"           // Postgres does not answer
	ReadyReasonMigrations = "migrations pending" // Tally's or River's migrations are not all applied
	ReadyReasonWorkers    = "workers stopped"    // this replica's River client has stopped
	ReadyReasonUnknown    = "unknown"            // any other error of the ReadyFunc
)

// NotReadyError is the error a ReadyFunc returns to say why the service is
// not ready: Reason (one of the ReadyReason constants) is answered to anyone,
// Err is only logged.
type NotReadyError struct {
	Reason string
	Err    error
}

func (e *NotReadyError) Error() string { return e.Reason + ": " + e.Err.Error() }

func (e *NotReadyError) Unwrap() error { return e.Err }

// handleHealthz answers 200 while the process runs.
func handleHealthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpjson.Encode(w, http.StatusOK, map[string]string{"status": "ok"})
	})
}

// handleReadyz answers 200 when ready reports no error, else 503 with a
// generic reason, {"status":"unavailable","reason":"database"}: the route is
// open, so the error itself (which may name hosts, users or databases) is
// only logged, at Warn, with the request id.
func handleReadyz(logger *slog.Logger, ready ReadyFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			reason := ReadyReasonUnknown
			var nre *NotReadyError
			if errors.As(err, &nre) {
				reason = nre.Reason
			}
			logger.WarnContext(r.Context(), "not ready", slog.String("reason", reason), slog.String("error", err.Error()),
				slog.String("request_id", httpjson.RequestIDFrom(r.Context())))
			httpjson.Encode(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": reason})
			return
		}
		httpjson.Encode(w, http.StatusOK, map[string]string{"status": "ok"})
	})
}
