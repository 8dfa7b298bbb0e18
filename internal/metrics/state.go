package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// State is what Postgres says about the work in flight: the gauges an
// operator alerts on. Ages are in seconds; zero when nothing waits.
type State struct {
	Charges                  map[string]float64    // unsettled charges by status
	Held                     map[string]float64    // held charges by reason
	CloseOverdueSeconds      float64               // the oldest open period past its close
	UnsettledSeconds         float64               // the oldest pending, unknown or processing charge
	RetryOverdueSeconds      float64               // the most overdue retry of a past_due charge
	OutboxLagSeconds         float64               // the oldest charge job available and not taken
	Jobs                     map[[2]string]float64 // River jobs not completed, by (queue, state)
	StripeEvents             map[string]float64    // webhook events received (not processed) and failed
	StripeEventOldestSeconds float64               // the oldest of those
	ChargingPaused           bool                  // the kill switch
	WebhookEndpointsDisabled float64               // webhook endpoints disabled for failing
	UsageRollupAgeSeconds    float64               // since the usage roll-ups last moved
	AgeSeconds               float64               // how old the counts were when read (a shared snapshot's age)
}

// StateFunc reads the State.
type StateFunc func(ctx context.Context) (*State, error)

// StateCollector exports a State read at most once per interval, however
// often and by however many scrapers it is scraped: a scrape within the
// interval answers the last read. A read that fails keeps the last State
// and counts in tally_state_read_errors_total.
type StateCollector struct {
	read     StateFunc
	interval time.Duration
	timeout  time.Duration
	logger   *slog.Logger

	mu     sync.Mutex
	state  *State
	readAt time.Time

	errors prometheus.Counter
	descs  map[string]*prometheus.Desc
}

// NewStateCollector returns a collector of read's State, read at most every
// interval.
func NewStateCollector(read StateFunc, interval time.Duration, logger *slog.Logger) *StateCollector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &StateCollector{
		read: read, interval: interval, timeout: 5 * time.Second, logger: logger,
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tally_state_read_errors_total",
			Help: "Failed reads of the state gauges from Postgres (the gauges keep their last values).",
		}),
		descs: map[string]*prometheus.Desc{
			"charges":        desc("tally_charges", "Charges not yet settled, by status (pending, unknown, processing, held, past_due).", "status"),
			"retry_overdue":  desc("tally_charge_retry_overdue_seconds", "How long past its time the most overdue retry of a past_due charge is (0: none overdue)."),
			"held":           desc("tally_charges_held", "Held charges waiting for an operator, by reason.", "reason"),
			"close_overdue":  desc("tally_period_close_overdue_seconds", "Age past its close time of the oldest open period (0: none overdue)."),
			"unsettled":      desc("tally_charge_unsettled_oldest_seconds", "Age of the oldest pending, unknown or processing charge (0: none)."),
			"outbox_lag":     desc("tally_outbox_lag_seconds", "How long the oldest available charge job has waited for a worker (0: none waits)."),
			"jobs":           desc("tally_river_jobs", "River jobs not completed, by queue and state.", "queue", "state"),
			"stripe_events":  desc("tally_stripe_webhook_events", "Stripe webhook events not processed, by status (received, failed).", "status"),
			"stripe_oldest":  desc("tally_stripe_webhook_event_oldest_seconds", "Age of the oldest Stripe webhook event not processed (0: none)."),
			"paused":         desc("tally_charging_paused", "1 while River's charge queue is paused (the kill switch), whoever paused it, else 0."),
			"hooks_disabled": desc("tally_webhook_endpoints_disabled", "Webhook endpoints disabled for failing: nothing is sent to them until billingctl webhooks enable."),
			"rollup_age":     desc("tally_usage_rollup_age_seconds", "Time since the usage roll-ups (the usage API, the usage thresholds) last moved: about twice TALLY_USAGE_ROLLUP_INTERVAL when well."),
			"state_age":      desc("tally_state_age_seconds", "Age of the state these gauges show (the shared snapshot's age plus the time since this replica read it)."),
			"state_interval": desc("tally_state_interval_seconds", "How often the state gauges are read from Postgres, at most."),
		},
	}
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	c.errors.Describe(ch)
}

// current returns the State, read again when the last read is older than
// the interval.
func (c *StateCollector) current() (*State, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == nil || time.Since(c.readAt) >= c.interval {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		st, err := c.read(ctx)
		if err != nil {
			c.errors.Inc()
			c.logger.Error("error reading the state gauges", slog.String("error", err.Error()))
		} else {
			c.state, c.readAt = st, time.Now()
		}
	}
	return c.state, c.readAt
}

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	c.errors.Collect(ch)
	st, readAt := c.current()
	if st == nil {
		return // never read: no gauges rather than false zeros
	}
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, labels...)
	}
	for _, status := range []string{"pending", "unknown", "processing", "held", "past_due"} {
		gauge("charges", st.Charges[status], status)
	}
	for reason, n := range st.Held {
		gauge("held", n, reason)
	}
	gauge("close_overdue", st.CloseOverdueSeconds)
	gauge("unsettled", st.UnsettledSeconds)
	gauge("retry_overdue", st.RetryOverdueSeconds)
	gauge("outbox_lag", st.OutboxLagSeconds)
	for k, n := range st.Jobs {
		gauge("jobs", n, k[0], k[1])
	}
	for _, status := range []string{"received", "failed"} {
		gauge("stripe_events", st.StripeEvents[status], status)
	}
	gauge("stripe_oldest", st.StripeEventOldestSeconds)
	paused := 0.0
	if st.ChargingPaused {
		paused = 1
	}
	gauge("paused", paused)
	gauge("hooks_disabled", st.WebhookEndpointsDisabled)
	gauge("rollup_age", st.UsageRollupAgeSeconds)
	gauge("state_age", st.AgeSeconds+time.Since(readAt).Seconds())
	gauge("state_interval", c.interval.Seconds())
}
