// Command stripesim runs the Stripe-compatible simulator (internal/stripesim) as an HTTP
// server for development, demos and multi-process tests.
//
// Usage:
//
//	stripesim [--addr 127.0.0.1:12111] [--log-level info] [--idempotency-retention 24h]
//
// Environment: STRIPESIM_WEBHOOK_URL (where signed events are POSTed; unset means events are
// only recorded), STRIPESIM_WEBHOOK_SECRET (the whsec_… signing secret; unset means
// stripesim.WebhookSecretDefault) and STRIPESIM_IDEMPOTENCY_RETENTION (the default of
// --idempotency-retention: how long an idempotency key's stored result is kept, as a Go
// duration; unset means stripesim.IdempotencyRetentionDefault, Stripe's 24 h). Point stripe-go (STRIPE_API_BASE) at the printed URL; see
// docs/stripesim.md for the control API.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tally-billing/tally/internal/stripesim"
)

// addrDefault is the default listen address: loopback only. The port is also stripe-mock's
// default HTTP port, so give one of the two another port when running both.
const addrDefault = "127.0.0.1:12111"

// shutdownTimeout bounds the graceful shutdown.
const shutdownTimeout = 10 * time.Second

func main() {
	if err := run(context.Background(), os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "stripesim:", err)
		os.Exit(1)
	}
}

// run starts the simulator and serves until ctx is done or SIGINT/SIGTERM arrives, then shuts
// down gracefully. It prints "stripesim listening on <url>" to stdout once it accepts
// connections, and logs JSON to stderr.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	flags := flag.NewFlagSet(args[0], flag.ContinueOnError)
	flags.SetOutput(stderr)
	addr := flags.String("addr", addrDefault, "listen address (host:port); keep it on loopback, the control API is unauthenticated")
	logLevel := flags.String("log-level", "info", "log level: debug, info, warn or error")
	retentionDefault := time.Duration(0)
	if v := getenv("STRIPESIM_IDEMPOTENCY_RETENTION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("invalid STRIPESIM_IDEMPOTENCY_RETENTION %q: want a Go duration such as 25s or 24h", v)
		}
		retentionDefault = d
	}
	retention := flags.Duration("idempotency-retention", retentionDefault,
		"how long an idempotency key's stored result is kept after the first request that used it, "+
			"on the simulator's clock; after that the key acts as new. 0 means Stripe's 24h. "+
			"Default from STRIPESIM_IDEMPOTENCY_RETENTION")
	if err := flags.Parse(args[1:]); err != nil {
		return err
	}
	if *retention < 0 {
		return fmt.Errorf("invalid --idempotency-retention %s: must not be negative", *retention)
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", flags.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("invalid --log-level %q: %w", *logLevel, err)
	}
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	sim := stripesim.New(stripesim.Config{
		Logger:               logger,
		IdempotencyRetention: *retention,
		WebhookURL:           getenv("STRIPESIM_WEBHOOK_URL"),
		WebhookSecret:        getenv("STRIPESIM_WEBHOOK_SECRET"),
	})
	defer sim.Close()

	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("error listening on %s: %w", *addr, err)
	}
	if tcpAddr, ok := listener.Addr().(*net.TCPAddr); ok && !tcpAddr.IP.IsLoopback() {
		logger.Warn("listening on a non-loopback address; the control API is unauthenticated", "addr", listener.Addr().String())
	}
	server := &http.Server{
		Handler:           sim,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- server.Serve(listener) }()

	url := "http://" + listener.Addr().String()
	logger.Info("stripesim listening", "url", url, "webhook_url", getenv("STRIPESIM_WEBHOOK_URL"),
		"idempotency_retention", stripesim.Config{IdempotencyRetention: *retention}.WithDefaults().IdempotencyRetention.String())
	fmt.Fprintf(stdout, "stripesim listening on %s\n", url)

	select {
	case err := <-serveErr:
		return fmt.Errorf("error serving: %w", err)
	case <-ctx.Done():
	}

	logger.Info("stripesim shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := server.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("error shutting down: %w", err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("error serving: %w", err)
	}
	logger.Info("stripesim stopped")
	return nil
}
