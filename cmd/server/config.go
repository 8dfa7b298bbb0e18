package main

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-billing/tally/internal/envconf"
	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripeapi"
)

// Roles a replica can run.
const (
	roleAPI    = "api"
	roleWorker = "worker"
)

// Defaults of the configuration, named after their variable.
const (
	httpAddrDefault    = ":8080"
	metricsAddrDefault = "127.0.0.1:9464" // loopback: scraped by an agent on the host; any other address needs TALLY_METRICS_TOKEN

	// metricsStateIntervalDefault is how often, at most, a replica reads the
	// state gauges (charges in flight, ages, River's jobs) from Postgres,
	// however often it is scraped.
	metricsStateIntervalDefault = 15 * time.Second
	shutdownTimeoutDefault      = 25 * time.Second

	// apiDBMaxConnsDefault and workerDBMaxConnsDefault size the two pools
	// for a 2-core replica: an API request holds a connection for one short
	// transaction; charge jobs hold one only between Stripe calls, and
	// River's notifier takes one more out of the workers' pool for LISTEN.
	apiDBMaxConnsDefault    = 8
	workerDBMaxConnsDefault = 10

	// queueDBMaxConns sizes the pool of River's own queries on a worker
	// replica: its LISTEN connection, one fetch per queue, the completer
	// and the leader's maintenance.
	queueDBMaxConns = 8
)

// config is the server's configuration, read from the environment by
// loadConfig. See the configuration table in README.md.
type config struct {
	DatabaseURL          string
	PoolerURL            string // TALLY_POOLER_URL: the API and worker pools connect through it; empty: DATABASE_URL
	APIDBMaxConns        int32  // the API's pool (TALLY_API_DB_MAX_CONNS)
	WorkerDBMaxConns     int32  // the workers' pool (TALLY_WORKER_DB_MAX_CONNS)
	DBMaxConnsDeprecated bool   // TALLY_DB_MAX_CONNS is set: warn at start
	HTTPAddr             string
	DebugAddr            string // TALLY_DEBUG_ADDR: net/http/pprof, loopback only; empty: off
	MetricsAddr          string // TALLY_METRICS_ADDR: the metrics listener; "off": none
	MetricsToken         string // TALLY_METRICS_TOKEN: required on a non-loopback metrics listener; also serves /metrics on the API behind it
	MetricsStateInterval time.Duration
	Roles                []string
	Workers              int
	RetryMaxDelay        time.Duration
	ReconcileInterval    time.Duration
	ReconcileAfter       time.Duration
	SweepInterval        time.Duration
	SweepAfter           time.Duration
	StripeEventRetention time.Duration
	StripeAPIKey         string
	StripeAPIBase        string
	StripeWebhookSecret  string
	StripeTimeout        time.Duration
	AllowLiveSecretKey   bool
	WebhooksAllowHTTP    bool          // TALLY_WEBHOOKS_ALLOW_HTTP (deprecated) is set: loopback is allowed; warn at start
	WebhookWorkers       int           // TALLY_WEBHOOK_WORKERS: webhook deliveries at once per worker replica
	WebhookTimeout       time.Duration // TALLY_WEBHOOK_TIMEOUT: one delivery attempt
	RollupInterval       time.Duration // TALLY_USAGE_ROLLUP_INTERVAL: how often usage is rolled up (and thresholds checked)
	ThresholdIntervalSet bool          // TALLY_USAGE_THRESHOLD_INTERVAL (removed) is set: warn at start
	DunningInterval      time.Duration // TALLY_DUNNING_INTERVAL: how often due retries are started
	LogLevel             slog.Level
	ShutdownTimeout      time.Duration

	// Config is what decides how charges are made and settled (cadence,
	// grace, key window, guards, namespace, dunning, http webhooks),
	// read by ledger.ConfigFromEnv as billingctl reads it.
	ledger.Config
}

func (c *config) has(role string) bool { return slices.Contains(c.Roles, role) }

// loadConfig reads the configuration from getenv and returns every problem
// found at once, each naming its variable.
func loadConfig(getenv func(string) string) (*config, error) {
	env := envconf.New(getenv)
	bad, get, duration, integer, boolean := env.Bad, env.String, env.Duration, env.Int, env.Bool
	c := &config{
		DatabaseURL:          get("DATABASE_URL", ""),
		PoolerURL:            get("TALLY_POOLER_URL", ""),
		HTTPAddr:             get("TALLY_HTTP_ADDR", httpAddrDefault),
		DebugAddr:            get("TALLY_DEBUG_ADDR", ""),
		MetricsAddr:          get("TALLY_METRICS_ADDR", metricsAddrDefault),
		MetricsToken:         get("TALLY_METRICS_TOKEN", ""),
		MetricsStateInterval: duration("TALLY_METRICS_STATE_INTERVAL", metricsStateIntervalDefault),
		Workers:              int(integer("TALLY_WORKERS", jobs.ConcurrencyDefault, 1, 10000)),
		ReconcileInterval:    duration("TALLY_RECONCILE_INTERVAL", jobs.ReconcileIntervalDefault),
		RetryMaxDelay:        duration("TALLY_RETRY_MAX_DELAY", jobs.RetryMaxDelayDefault),
		ReconcileAfter:       duration("TALLY_RECONCILE_AFTER", jobs.ReconcileAfterDefault),
		SweepInterval:        duration("TALLY_SWEEP_INTERVAL", jobs.SweepIntervalDefault),
		SweepAfter:           duration("TALLY_SWEEP_AFTER", jobs.SweepAfterDefault),
		StripeEventRetention: duration("TALLY_STRIPE_EVENT_RETENTION", ledger.StripeEventRetentionDefault),
		StripeAPIKey:         get("STRIPE_API_KEY", ""),
		StripeAPIBase:        get("STRIPE_API_BASE", ""),
		StripeWebhookSecret:  get("STRIPE_WEBHOOK_SECRET", ""),
		StripeTimeout:        duration("STRIPE_TIMEOUT", stripeapi.TimeoutDefault),
		ShutdownTimeout:      duration("TALLY_SHUTDOWN_TIMEOUT", shutdownTimeoutDefault),
		WebhookWorkers:       int(integer("TALLY_WEBHOOK_WORKERS", jobs.DeliveryWorkersDefault, 1, 1000)),
		WebhookTimeout:       duration("TALLY_WEBHOOK_TIMEOUT", jobs.DeliveryTimeoutDefault),
		RollupInterval:       duration("TALLY_USAGE_ROLLUP_INTERVAL", jobs.UsageRollupIntervalDefault),
		ThresholdIntervalSet: get("TALLY_USAGE_THRESHOLD_INTERVAL", "") != "",
		DunningInterval:      duration("TALLY_DUNNING_INTERVAL", jobs.DunningIntervalDefault),
	}
	// An empty variable means its default, as every variable here does.
	lc, err := ledger.ConfigFromEnv(getenv)
	env.Add(err)
	c.Config = lc
	// TALLY_DB_MAX_CONNS (deprecated) was the one pool's size; it is now the
	// default of each pool's own variable.
	legacyMaxConns := integer("TALLY_DB_MAX_CONNS", 0, 0, 10000)
	c.DBMaxConnsDeprecated = get("TALLY_DB_MAX_CONNS", "") != ""
	poolDefault := func(def int64) int64 {
		if legacyMaxConns > 0 {
			return legacyMaxConns
		}
		return def
	}
	c.APIDBMaxConns = int32(integer("TALLY_API_DB_MAX_CONNS", poolDefault(apiDBMaxConnsDefault), 1, 10000))
	c.WorkerDBMaxConns = int32(integer("TALLY_WORKER_DB_MAX_CONNS", poolDefault(workerDBMaxConnsDefault), 2, 10000))
	if c.DebugAddr != "" && !loopbackAddr(c.DebugAddr) {
		bad("TALLY_DEBUG_ADDR", "%q is not a loopback address: the profiler shows the process's internals, so bind it to 127.0.0.1:port or [::1]:port", c.DebugAddr)
	}
	if c.MetricsAddr != "off" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			bad("TALLY_METRICS_ADDR", "%q is not host:port (such as 127.0.0.1:9464) or off", c.MetricsAddr)
		} else if c.MetricsToken == "" && !loopbackAddr(c.MetricsAddr) {
			bad("TALLY_METRICS_ADDR", "%q is not a loopback address and TALLY_METRICS_TOKEN is unset: anyone reaching it would read the metrics; "+
				"set TALLY_METRICS_TOKEN (scrapers send it as Authorization: Bearer <token>), bind 127.0.0.1:port, or off", c.MetricsAddr)
		}
	}
	if c.MetricsToken != "" && len(c.MetricsToken) < 16 {
		bad("TALLY_METRICS_TOKEN", "is %d characters: use at least 16 random ones (openssl rand -hex 16)", len(c.MetricsToken))
	}
	if c.DatabaseURL == "" {
		bad("DATABASE_URL", "is required, such as postgres://user@127.0.0.1:5432/tally")
	}
	if c.PoolerURL != "" {
		// The parser's error is not shown: it would quote the URL, password
		// and all.
		if _, err := pgx.ParseConfig(c.PoolerURL); err != nil {
			bad("TALLY_POOLER_URL", "is not a Postgres connection string; use a URL such as postgres://user@pgbouncer:6432/tally")
		}
	}
	for _, r := range strings.Split(get("TALLY_ROLES", "api,worker"), ",") {
		r = strings.TrimSpace(r)
		switch r {
		case roleAPI, roleWorker:
			if !slices.Contains(c.Roles, r) {
				c.Roles = append(c.Roles, r)
			}
		case "":
		default:
			bad("TALLY_ROLES", "unknown role %q: want api, worker or api,worker", r)
		}
	}
	if len(c.Roles) == 0 {
		bad("TALLY_ROLES", "names no role: want api, worker or api,worker")
	}
	c.AllowLiveSecretKey = boolean("TALLY_ALLOW_LIVE_SECRET_KEY")
	// TALLY_WEBHOOKS_ALLOW_HTTP (deprecated) allows loopback's networks
	// (ledger.ConfigFromEnv): warned at start.
	c.WebhooksAllowHTTP = boolean("TALLY_WEBHOOKS_ALLOW_HTTP")
	if err := c.LogLevel.UnmarshalText([]byte(get("TALLY_LOG_LEVEL", "info"))); err != nil {
		bad("TALLY_LOG_LEVEL", "want debug, info, warn or error")
	}

	if c.has(roleWorker) {
		switch key := c.StripeAPIKey; {
		case key == "":
			bad("STRIPE_API_KEY", "is required by the worker role; use a restricted key (rk_…) allowed to write PaymentIntents and Refunds and read Customers")
		case strings.HasPrefix(key, "sk_live_") && !c.AllowLiveSecretKey:
			bad("STRIPE_API_KEY", "is an unrestricted live secret key; use a restricted key (rk_live_…), or set TALLY_ALLOW_LIVE_SECRET_KEY=true to accept the risk")
		case !strings.HasPrefix(key, "sk_") && !strings.HasPrefix(key, "rk_"):
			bad("STRIPE_API_KEY", "does not look like a Stripe key (rk_… or sk_…)")
		}
	}
	// Stripe keeps a key 24 h from its first use; the window plus a lease
	// (a call in flight when it ends) must stay inside that.
	if _, leaseTTL, _ := jobs.ChargeTimings(c.StripeTimeout); c.StripeKeyWindow+leaseTTL+time.Minute > 24*time.Hour {
		bad("TALLY_STRIPE_KEY_WINDOW", "%s plus a charge lease (%s) must stay under Stripe's 24 h key retention; use %s or less",
			c.StripeKeyWindow, leaseTTL, (24*time.Hour - leaseTTL - time.Minute).Truncate(time.Minute))
	}
	if c.StripeAPIBase != "" && !strings.HasPrefix(c.StripeAPIBase, "http://") && !strings.HasPrefix(c.StripeAPIBase, "https://") {
		bad("STRIPE_API_BASE", "%q is not an http(s) URL", c.StripeAPIBase)
	}
	if s := c.StripeWebhookSecret; s != "" && !strings.HasPrefix(s, "whsec_") {
		bad("STRIPE_WEBHOOK_SECRET", "does not look like a Stripe webhook secret (whsec_…)")
	}
	if err := env.Err(); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// loopbackAddr reports whether addr (host:port) names a loopback host.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
