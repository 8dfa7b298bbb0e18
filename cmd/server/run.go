package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/tally-billing/tally/internal/api"
	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/schema"
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

	pool, err := ledger.Connect(ctx, cfg.DatabaseURL, "tally-server", cfg.DBMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()

	inserter, err := jobs.NewInsertClient(pool, logger)
	if err != nil {
		return err
	}
	l, err := ledger.New(pool, ledger.Config{
		Cadence:           cfg.Cadence,
		CloseGrace:        cfg.CloseGrace,
		StripeKeyWindow:   cfg.StripeKeyWindow,
		PeriodBudgetCents: cfg.PeriodBudgetCents,
		AnomalyFactor:     cfg.AnomalyFactor,
		Scheduler:         jobs.Scheduler{Client: inserter},
		Logger:            logger,
	})
	if err != nil {
		return err
	}

	var worker *river.Client[pgx.Tx]
	if cfg.has(roleWorker) {
		worker, err = jobs.NewWorkerClient(pool, jobs.WorkerConfig{
			Ledger: l,
			Stripe: jobs.NewStripeAPI(jobs.StripeConfig{
				APIKey: cfg.StripeAPIKey, BaseURL: cfg.StripeAPIBase, Timeout: cfg.StripeTimeout, Logger: logger,
			}),
			StripeTimeout:        cfg.StripeTimeout,
			Concurrency:          cfg.Workers,
			Logger:               logger,
			ReconcileInterval:    cfg.ReconcileInterval,
			RetryMaxDelay:        cfg.RetryMaxDelay,
			ReconcileAfter:       cfg.ReconcileAfter,
			StripeEventRetention: cfg.StripeEventRetention,
		})
		if err != nil {
			return err
		}
		if err := worker.Start(ctx); err != nil {
			return fmt.Errorf("error starting river workers: %w", err)
		}
		logger.InfoContext(ctx, "workers started", slog.Int("concurrency", cfg.Workers))
	}

	var srv *http.Server
	serveErr := make(chan error, 1)
	if cfg.has(roleAPI) {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("error listening on TALLY_HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
		}
		srv = &http.Server{
			Handler:           api.NewServer(logger, l, readyFunc(pool, worker), cfg.StripeWebhookSecret),
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       60 * time.Second,
			WriteTimeout:      60 * time.Second,
			IdleTimeout:       120 * time.Second,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		}
		logger.InfoContext(ctx, "listening", slog.String("addr", ln.Addr().String()), slog.Any("roles", cfg.Roles))
		go func() { serveErr <- srv.Serve(ln) }()
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

// readyFunc reports ready when Postgres answers, every migration is applied
// and, on worker replicas, River's client has not stopped.
func readyFunc(pool *pgxpool.Pool, worker *river.Client[pgx.Tx]) api.ReadyFunc {
	return func(ctx context.Context) error {
		if err := pool.Ping(ctx); err != nil {
			return fmt.Errorf("postgres unreachable: %w", err)
		}
		if err := schema.Check(ctx, pool); err != nil {
			return err
		}
		if worker != nil {
			select {
			case <-worker.Stopped():
				return errors.New("river workers stopped")
			default:
			}
		}
		return nil
	}
}
