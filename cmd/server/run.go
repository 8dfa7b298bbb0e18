package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"riverqueue.com/riverui"

	"github.com/tally-billing/tally/internal/api"
	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/metrics"
	"github.com/tally-billing/tally/internal/postgres"
	"github.com/tally-billing/tally/internal/schema"
	"github.com/tally-billing/tally/internal/stripeapi"
)

// run is the whole program: it reads the configuration from getenv, starts
// the roles it names, and returns when ctx is done or SIGINT/SIGTERM
// arrives, after draining in-flight requests and stopping River.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.LogLevel}))

	if cfg.DBMaxConnsDeprecated {
		logger.WarnContext(ctx, "TALLY_DB_MAX_CONNS is deprecated: it sizes each of the API's and the workers' pools; "+
			"set TALLY_API_DB_MAX_CONNS and TALLY_WORKER_DB_MAX_CONNS instead",
			slog.Int("api_db_max_conns", int(cfg.APIDBMaxConns)), slog.Int("worker_db_max_conns", int(cfg.WorkerDBMaxConns)))
	}

	if cfg.ThresholdIntervalSet {
		logger.WarnContext(ctx, "TALLY_USAGE_THRESHOLD_INTERVAL is ignored: the usage roll-up checks the thresholds, "+
			"every TALLY_USAGE_ROLLUP_INTERVAL", slog.Duration("usage_rollup_interval", cfg.RollupInterval))
	}

	if cfg.WebhooksAllowHTTP {
		logger.WarnContext(ctx, "TALLY_WEBHOOKS_ALLOW_HTTP is deprecated: it allows webhooks to loopback addresses, plain http to a loopback host included; "+
			"set TALLY_WEBHOOKS_ALLOW_CIDRS=127.0.0.0/8,::1/128 instead")
	}

	m := metrics.New()
	if cfg.MetricsAddr != "off" {
		h := m.Handler()
		if !loopbackAddr(cfg.MetricsAddr) {
			h = api.MetricsHandler(m, cfg.MetricsToken) // loadConfig refuses this address without a token
		}
		stopMetrics, err := serveMetrics(cfg.MetricsAddr, h, logger)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}

	// The API and the workers each get their own pool (and application_name),
	// so a flood of requests can never take the connections the charge path
	// needs, nor the reverse.
	var apiLedger, workerLedger *ledger.Ledger
	var apiPool, workerPool *pgxpool.Pool
	if cfg.has(roleAPI) {
		apiPool, apiLedger, err = connectLedger(ctx, cfg, logger, m, appNameAPI, cfg.APIDBMaxConns)
		if err != nil {
			return err
		}
		defer apiPool.Close()
	}

	var worker *river.Client[pgx.Tx]
	if cfg.has(roleWorker) {
		workerPool, workerLedger, err = connectLedger(ctx, cfg, logger, m, appNameWorker, cfg.WorkerDBMaxConns)
		if err != nil {
			return err
		}
		defer workerPool.Close()
		// River's own queries (fetching, completing, scheduling jobs) run on
		// a small pool of their own, planned afresh each time.
		queuePool, err := postgres.ConnectQueue(ctx, cfg.DatabaseURL, appNameQueue, queueDBMaxConns)
		if err != nil {
			return err
		}
		defer queuePool.Close()
		worker, err = jobs.NewWorkerClient(queuePool, jobs.WorkerConfig{
			Ledger: workerLedger,
			Stripe: stripeapi.New(stripeapi.Config{
				APIKey: cfg.StripeAPIKey, BaseURL: cfg.StripeAPIBase, Timeout: cfg.StripeTimeout, Logger: logger, Metrics: m,
				MaxIdleConns: cfg.Workers + 8, // every worker, and the reconciler and sweeps beside them
			}),
			StripeTimeout:        cfg.StripeTimeout,
			Concurrency:          cfg.Workers,
			Logger:               logger,
			ReconcileInterval:    cfg.ReconcileInterval,
			RetryMaxDelay:        cfg.RetryMaxDelay,
			ReconcileAfter:       cfg.ReconcileAfter,
			SweepInterval:        cfg.SweepInterval,
			SweepAfter:           cfg.SweepAfter,
			StripeEventRetention: cfg.StripeEventRetention,
			DeliveryWorkers:      cfg.WebhookWorkers,
			DeliveryTimeout:      cfg.WebhookTimeout,
			DeliveryAllow:        cfg.WebhooksAllow,
			UsageRollupInterval:  cfg.RollupInterval,
			DunningInterval:      cfg.DunningInterval,
		})
		if err != nil {
			return err
		}
		if err := worker.Start(ctx); err != nil {
			return fmt.Errorf("error starting river workers: %w", err)
		}
		go jobs.QueueStatsKeep(ctx, queuePool, logger)
		m.RoleStarted(roleWorker)
		logger.InfoContext(ctx, "workers started", slog.Int("concurrency", cfg.Workers))
	}

	if cfg.DebugAddr != "" {
		stopDebug, err := serveDebug(cfg.DebugAddr, logger)
		if err != nil {
			return err
		}
		defer stopDebug()
	}

	stateLedger, statePool := apiLedger, apiPool
	if stateLedger == nil {
		stateLedger, statePool = workerLedger, workerPool
	}
	m.Register(metrics.NewStateCollector(readState(stateLedger, statePool, cfg.MetricsStateInterval), cfg.MetricsStateInterval, logger))

	var srv *http.Server
	serveErr := make(chan error, 1)
	if cfg.has(roleAPI) {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("error listening on TALLY_HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
		}
		riverUI, err := startRiverUI(ctx, apiPool, logger)
		if err != nil {
			return err
		}
		srv = &http.Server{
			Handler: api.NewServer(logger, apiLedger, readyFunc(apiPool, workerPool, worker), cfg.StripeWebhookSecret,
				api.WithMetrics(m, cfg.MetricsToken), api.WithRiverUI(riverUI, jobs.Queues)),
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       60 * time.Second,
			WriteTimeout:      60 * time.Second,
			IdleTimeout:       120 * time.Second,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		}
		logger.InfoContext(ctx, "listening", slog.String("addr", ln.Addr().String()), slog.Any("roles", cfg.Roles))
		go func() { serveErr <- srv.Serve(ln) }()
		m.RoleStarted(roleAPI)
	}

	select {
	case <-ctx.Done():
		logger.Info("shutting down", slog.Duration("timeout", cfg.ShutdownTimeout))
	case err := <-serveErr:
		if !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server failed", slog.String("error", err.Error()))
		}
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	var errs []error
	if srv != nil {
		if err := srv.Shutdown(shutdownCtx); err != nil {
			errs = append(errs, fmt.Errorf("error draining http requests: %w", err))
		}
	}
	if worker != nil {
		// Stop lets running jobs finish; past the timeout they are cancelled
		// and River rescues them later (the charge lease keeps that safe).
		if err := worker.Stop(shutdownCtx); err != nil {
			errs = append(errs, fmt.Errorf("error stopping river workers: %w", err))
		}
	}
	logger.Info("stopped")
	return errors.Join(errs...)
}

// Application names of the two pools, as pg_stat_activity shows them.
const (
	appNameAPI    = "tally-server-api"
	appNameWorker = "tally-server-worker"
	appNameQueue  = "tally-server-queue"
)

// connectLedger opens a pool named appName of at most maxConns connections
// (through TALLY_POOLER_URL when set, else to DATABASE_URL) and the ledger
// that runs on it, with an insert-only River client on the same pool as its
// scheduler.
func connectLedger(ctx context.Context, cfg *config, logger *slog.Logger, m *metrics.Metrics, appName string, maxConns int32) (*pgxpool.Pool, *ledger.Ledger, error) {
	connect, url := postgres.Connect, cfg.DatabaseURL
	if cfg.PoolerURL != "" {
		connect, url = postgres.ConnectPooled, cfg.PoolerURL
	}
	pool, err := connect(ctx, url, appName, maxConns)
	if err != nil {
		return nil, nil, err
	}
	inserter, err := jobs.NewInsertClient(pool, logger)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	lc := cfg.Config
	lc.Scheduler, lc.Logger, lc.OnChargeTransition, lc.OnIngestGroup = jobs.Scheduler{Client: inserter}, logger, m.ChargeTransition, m.IngestGroup
	l, err := ledger.New(pool, lc)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, l, nil
}

// readyFunc reports ready when Postgres answers on each pool, every
// migration is applied and, on worker replicas, River's client has not
// stopped. Its errors are *api.NotReadyError: the reason is answered, the
// detail only logged.
func readyFunc(apiPool, workerPool *pgxpool.Pool, worker *river.Client[pgx.Tx]) api.ReadyFunc {
	return func(ctx context.Context) error {
		for _, pool := range []*pgxpool.Pool{apiPool, workerPool} {
			if pool == nil {
				continue
			}
			if err := pool.Ping(ctx); err != nil {
				return &api.NotReadyError{Reason: api.ReadyReasonDatabase,
					Err: fmt.Errorf("postgres unreachable (%s pool): %w", pool.Config().ConnConfig.RuntimeParams["application_name"], err)}
			}
		}
		if err := schema.Check(ctx, cmp.Or(apiPool, workerPool)); err != nil {
			reason := api.ReadyReasonMigrations
			if isDatabaseError(err) {
				reason = api.ReadyReasonDatabase
			}
			return &api.NotReadyError{Reason: reason, Err: err}
		}
		if worker != nil {
			select {
			case <-worker.Stopped():
				return &api.NotReadyError{Reason: api.ReadyReasonWorkers, Err: errors.New("river workers stopped")}
			default:
			}
		}
		return nil
	}
}

// isDatabaseError reports whether err comes from talking to Postgres (an
// error it answered, a lost connection, a timeout) rather than from what the
// migrations check found.
func isDatabaseError(err error) bool {
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &pgErr) || errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || pgconn.Timeout(err)
}

// stateSnapshot is the shared snapshot of the state gauges
// (ledger.OperationsSnapshotGet): the ledger's work in flight and River's
// jobs, with the times ages are measured from, so a replica reading it later
// shows ages as of its read.
type stateSnapshot struct {
	Ops                  *ledger.OperationsState `json:"ops"`
	Jobs                 []stateJobs             `json:"jobs"`
	ChargeAvailableSince *time.Time              `json:"charge_available_since"`
}

type stateJobs struct {
	Queue string `json:"queue"`
	State string `json:"state"`
	N     int64  `json:"n"`
}

// readState reads the state gauges from the snapshot every replica shares,
// taken again from the ledger and River's table by one replica once it is
// interval old.
func readState(l *ledger.Ledger, pool *pgxpool.Pool, interval time.Duration) metrics.StateFunc {
	take := func(ctx context.Context) (json.RawMessage, error) {
		ops, err := l.OperationsStateGet(ctx)
		if err != nil {
			return nil, err
		}
		queue, err := jobs.QueueStateGet(ctx, pool)
		if err != nil {
			return nil, err
		}
		snap := stateSnapshot{Ops: ops, ChargeAvailableSince: queue.ChargeAvailableSince}
		for k, n := range queue.Jobs {
			snap.Jobs = append(snap.Jobs, stateJobs{Queue: k[0], State: k[1], N: n})
		}
		return json.Marshal(snap)
	}
	age := func(now time.Time, since *time.Time) float64 {
		if since == nil {
			return 0
		}
		return max(now.Sub(*since).Seconds(), 0)
	}
	return func(ctx context.Context) (*metrics.State, error) {
		stored, err := l.OperationsSnapshotGet(ctx, interval, take)
		if err != nil {
			return nil, err
		}
		var snap stateSnapshot
		if err := json.Unmarshal(stored.State, &snap); err != nil {
			return nil, fmt.Errorf("error decoding the operations snapshot taken at %s: %w", stored.TakenAt, err)
		}
		if snap.Ops == nil {
			return nil, fmt.Errorf("the operations snapshot taken at %s holds no ledger state", stored.TakenAt)
		}
		ops, now := snap.Ops, stored.Now
		st := &metrics.State{
			Charges: map[string]float64{}, Held: map[string]float64{}, Jobs: map[[2]string]float64{}, StripeEvents: map[string]float64{},
			CloseOverdueSeconds: age(now, ops.CloseOverdueSince), UnsettledSeconds: age(now, ops.UnsettledSince),
			RetryOverdueSeconds: age(now, ops.RetryOverdueSince),
			OutboxLagSeconds:    age(now, snap.ChargeAvailableSince), StripeEventOldestSeconds: age(now, ops.StripeEventSince),
			ChargingPaused: ops.ChargingPausedSince != nil, WebhookEndpointsDisabled: float64(ops.WebhookEndpointsDisabled),
			UsageRollupAgeSeconds: age(now, ops.UsageRolledAt),
			AgeSeconds:            age(now, &stored.TakenAt),
		}
		for status, n := range ops.Charges {
			st.Charges[string(status)] = float64(n)
		}
		for reason, n := range ops.Held {
			st.Held[string(reason)] = float64(n)
		}
		for _, j := range snap.Jobs {
			st.Jobs[[2]string{j.Queue, j.State}] = float64(j.N)
		}
		for status, n := range ops.StripeEvents {
			st.StripeEvents[status] = float64(n)
		}
		return st, nil
	}
}

// startRiverUI returns River's own UI (riverqueue.com/riverui) for
// /riverui/, on an insert-only River client of pool, its background services
// running until ctx ends. The API mounts it behind the admin scope.
func startRiverUI(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (http.Handler, error) {
	client, err := jobs.NewInsertClient(pool, logger)
	if err != nil {
		return nil, err
	}
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    logger,
		Prefix:    "/riverui",
	})
	if err != nil {
		return nil, fmt.Errorf("error creating the River UI: %w", err)
	}
	if err := h.Start(ctx); err != nil {
		return nil, fmt.Errorf("error starting the River UI: %w", err)
	}
	return h, nil
}

// serveMetrics serves h, the metrics, at /metrics on addr
// (TALLY_METRICS_ADDR) until the returned function is called.
func serveMetrics(addr string, h http.Handler, logger *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("error listening on TALLY_METRICS_ADDR %s (set another address, or off): %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger.Info("metrics listening", slog.String("addr", ln.Addr().String()))
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}

// serveDebug serves net/http/pprof's handlers on addr (TALLY_DEBUG_ADDR, a
// loopback address) until the returned function is called: `go tool pprof
// http://ADDR/debug/pprof/profile?seconds=10` profiles a running replica.
func serveDebug(addr string, logger *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("error listening on TALLY_DEBUG_ADDR %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger.Info("profiler listening", slog.String("addr", ln.Addr().String()))
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}
