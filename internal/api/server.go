package api

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/metrics"
)

// ReadyFunc reports whether the service can take traffic (database
// reachable, migrations current); a non-nil error makes /readyz answer 503
// with the Reason of a *NotReadyError (ReadyReasonUnknown for any other
// error). The error itself is logged, never answered.
type ReadyFunc func(ctx context.Context) error

// Option configures NewServer.
type Option func(*options)

type options struct {
	metrics       *metrics.Metrics
	metricsToken  string
	riverUI       http.Handler
	riverUIQueues []string
}

// WithRiverUI mounts River's own UI (riverqueue.com/riverui, built with the
// prefix /riverui) at /riverui/, for API keys with the admin scope only: a
// browser is asked for one with a basic-auth prompt (any user name, the key
// as the password); a client may send it as a bearer token. Requests that
// change state must come from the UI's own pages (requireSameOrigin), and
// the UI may not pause or resume queues, the River queues Tally runs
// (jobs.Queues), nor every queue at once: charging's kill switch is the
// admin API's, which records who and why.
func WithRiverUI(h http.Handler, queues []string) Option {
	return func(o *options) { o.riverUI, o.riverUIQueues = h, queues }
}

// WithMetrics counts every request, and the usage events' results, in m.
// With a non-empty token, GET /metrics serves m on the API too, to requests
// that send "Authorization: Bearer <token>" (TALLY_METRICS_TOKEN); without
// one it is not routed.
func WithMetrics(m *metrics.Metrics, token string) Option {
	return func(o *options) { o.metrics, o.metricsToken = m, token }
}

// MetricsHandler serves m to requests that send "Authorization: Bearer
// <token>" (TALLY_METRICS_TOKEN, compared in constant time) and answers 401
// to the others: GET /metrics on the API, and the metrics listener when it
// is not bound to loopback.
func MetricsHandler(m *metrics.Metrics, token string) http.Handler {
	return requireToken(token, m.Handler())
}

// NewServer returns the HTTP handler of the API: every route of routes.go
// behind request ids, access logs and panic recovery. webhookSecret is the
// Stripe endpoint secret (whsec_…); empty refuses webhooks.
func NewServer(logger *slog.Logger, l *ledger.Ledger, ready ReadyFunc, webhookSecret string, opts ...Option) http.Handler {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	mux := http.NewServeMux()
	addRoutes(mux, logger, l, ready, webhookSecret, o)
	var h http.Handler = mux
	h = withAccessLog(logger, o.metrics, h)
	h = withRecover(logger, h)
	h = httpjson.WithRequestID(h)
	return h
}

// createdOrOK is the status of a create that is idempotent: 201 when it
// wrote, 200 for a replay or an update.
func createdOrOK(created bool) int {
	if created {
		return http.StatusCreated
	}
	return http.StatusOK
}
