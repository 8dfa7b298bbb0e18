// Package metrics is Tally's Prometheus instrumentation: the metrics a
// replica counts itself (HTTP requests, usage events, Stripe calls) on a
// registry of its own with Go's runtime and process collectors, and the
// handler that serves them in the text format.
//
// Every method is safe on a nil *Metrics, which counts nothing: tests and
// tools build the API and the workers without metrics.
package metrics

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stripe/stripe-go/v76"
)

// Usage event results, the values of tally_usage_events_total's label.
const (
	UsageCreated      = "created"       // recorded
	UsageReplayed     = "replayed"      // an exact re-post of a recorded event
	UsageConflict     = "conflict"      // its event_id was recorded with another payload
	UsagePeriodClosed = "period_closed" // its period closed
	UsageRejected     = "rejected"      // invalid, or in a batch refused for another item
)

// Metrics holds a replica's own metrics.
type Metrics struct {
	registry       *prometheus.Registry
	httpRequests   *prometheus.CounterVec
	httpDuration   *prometheus.HistogramVec
	usageEvents    *prometheus.CounterVec
	batchSize      prometheus.Histogram
	stripeCalls    *prometheus.CounterVec
	stripeDuration *prometheus.HistogramVec
	transitions    *prometheus.CounterVec
	roles          *prometheus.GaugeVec
	ingestGroups   prometheus.Histogram
}

// New returns Metrics registered on a new registry with the Go runtime and
// process collectors.
func New() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_http_requests_total",
			Help: "HTTP requests answered, by route pattern, method and status class (2xx, 4xx, 5xx).",
		}, []string{"route", "method", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tally_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by route pattern and method.",
			Buckets: []float64{.001, .0025, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route", "method"}),
		usageEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_usage_events_total",
			Help: "Usage events posted, by result: created, replayed, conflict, period_closed, rejected.",
		}, []string{"result"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_usage_event_batch_size",
			Help:    "Events per batch posted to POST /v1/usage-events/batch.",
			Buckets: []float64{1, 10, 50, 100, 250, 500, 750, 1000},
		}),
		stripeCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_stripe_requests_total",
			Help: "Calls to Stripe, by operation and outcome: ok, card_error, rate_limited, client_error, server_error, network_error.",
		}, []string{"operation", "outcome"}),
		stripeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tally_stripe_request_duration_seconds",
			Help:    "Time a call to Stripe took, by operation.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"operation"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tally_charge_transitions_total",
			Help: "Charge status changes committed by this replica, by from and to status (from=\"none\": the charge's creation).",
		}, []string{"from", "to"}),
		ingestGroups: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tally_ingest_group_events",
			Help:    "Single events (POST /v1/usage-events) per shared statement and commit: 1 when an event found a writer free and went alone.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
		roles: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tally_replica_role",
			Help: "1 for each role this replica runs (api, worker) once it has started: the alerts TallyAPIDown and TallyWorkersDown fire when no replica exports a role.",
		}, []string{"role"}),
	}
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.httpRequests, m.httpDuration, m.usageEvents, m.batchSize, m.stripeCalls, m.stripeDuration, m.transitions, m.roles, m.ingestGroups,
	)
	return m
}

// Register adds collectors (the ledger's gauges) to m's registry.
func (m *Metrics) Register(cs ...prometheus.Collector) {
	if m != nil {
		m.registry.MustRegister(cs...)
	}
}

// Handler serves m's metrics in Prometheus' text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// ObserveHTTP counts a request answered with status after d. route is the
// pattern that served it ("POST /v1/usage-events"), never the raw path.
func (m *Metrics) ObserveHTTP(route, method string, status int, d time.Duration) {
	if m == nil {
		return
	}
	if route == "" {
		route = "unmatched"
	}
	m.httpRequests.WithLabelValues(route, method, strconv.Itoa(status/100)+"xx").Inc()
	m.httpDuration.WithLabelValues(route, method).Observe(d.Seconds())
}

// CountUsageEvents counts n events of result.
func (m *Metrics) CountUsageEvents(result string, n int) {
	if m == nil || n == 0 {
		return
	}
	m.usageEvents.WithLabelValues(result).Add(float64(n))
}

// ObserveBatch records the size of a posted batch.
func (m *Metrics) ObserveBatch(n int) {
	if m != nil {
		m.batchSize.Observe(float64(n))
	}
}

// ObserveStripe counts a Stripe call of operation that ended with err after
// d.
func (m *Metrics) ObserveStripe(operation string, err error, d time.Duration) {
	if m == nil {
		return
	}
	m.stripeCalls.WithLabelValues(operation, StripeOutcome(err)).Inc()
	m.stripeDuration.WithLabelValues(operation).Observe(d.Seconds())
}

// ChargeTransition counts a committed charge status change (from "" for a
// charge's creation): the ledger's Config.OnChargeTransition.
func (m *Metrics) ChargeTransition(from, to string) {
	if m == nil {
		return
	}
	if from == "" {
		from = "none"
	}
	m.transitions.WithLabelValues(from, to).Inc()
}

// IngestGroup records the size of a group of single events written: the
// ledger's Config.OnIngestGroup.
func (m *Metrics) IngestGroup(events int) {
	if m != nil {
		m.ingestGroups.Observe(float64(events))
	}
}

// RoleStarted exports tally_replica_role{role} = 1: this replica runs role
// ("api" or "worker") from now on.
func (m *Metrics) RoleStarted(role string) {
	if m != nil {
		m.roles.WithLabelValues(role).Set(1)
	}
}

// StripeOutcome classes a Stripe call's error for tally_stripe_requests_total.
func StripeOutcome(err error) string {
	if err == nil {
		return "ok"
	}
	var se *stripe.Error
	if !errors.As(err, &se) {
		return "network_error"
	}
	switch {
	case se.HTTPStatusCode == http.StatusTooManyRequests:
		return "rate_limited"
	case se.HTTPStatusCode >= 500:
		return "server_error"
	case se.Type == stripe.ErrorTypeCard || se.HTTPStatusCode == http.StatusPaymentRequired:
		return "card_error"
	}
	return "client_error"
}
