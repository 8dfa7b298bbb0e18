package api

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/tally-billing/tally/internal/ledger"
)

// ReadyFunc reports whether the service can take traffic (database
// reachable, migrations current); a non-nil error makes /readyz answer 503
// with the Reason of a *NotReadyError (ReadyReasonUnknown for any other
// error). The error itself is logged, never answered.
type ReadyFunc func(ctx context.Context) error

// NewServer returns the HTTP handler of the API: every route of routes.go
// behind request ids, access logs and panic recovery. webhookSecret is the
// Stripe endpoint secret (whsec_…); empty refuses webhooks.
func NewServer(logger *slog.Logger, l *ledger.Ledger, ready ReadyFunc, webhookSecret string) http.Handler {
	mux := http.NewServeMux()
	addRoutes(mux, logger, l, ready, webhookSecret)
	var h http.Handler = mux
	h = withAccessLog(logger, h)
	h = withRecover(logger, h)
	h = withRequestID(h)
	return h
}
