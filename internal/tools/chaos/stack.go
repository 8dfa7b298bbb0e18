package chaos

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/proc"
)

// stackConfig describes the Tally processes of a run. Its database must
// exist; newStack migrates it.
type stackConfig struct {
	binDir string // the four commands, from proc.Commands
	logDir string // one log file per process
	dbURL  string // every process's DATABASE_URL
	apis   int    // API replicas (TALLY_ROLES=api)
	// workers is the number of worker replicas (TALLY_ROLES=worker).
	workers int
	// simRetention is the simulator's idempotency retention; zero keeps
	// Stripe's 24 h.
	simRetention time.Duration
	// env is added to every replica's environment (a budget, for instance).
	env []string
}

// stack is the Tally processes of a run: the Stripe simulator and the API
// and worker replicas of cmd/server, every one a restartable proc.Proc, and an
// API key with every scope.
type stack struct {
	sim     *proc.Proc
	control *stripesim.ControlClient
	apis    []*proc.Proc
	workers []*proc.Proc
	apiURLs []string
	key     string
}

// newStack migrates the database, creates an API key with billingctl, and
// starts the simulator (webhooks to the first API replica) and the replicas
// with the chaos timings (config.go), waiting until each answers. On error
// it stops whatever it started.
func newStack(ctx context.Context, sc stackConfig) (*stack, error) {
	dbEnv := []string{"DATABASE_URL=" + sc.dbURL}
	if _, err := proc.RunTool(ctx, filepath.Join(sc.binDir, "migrate"), dbEnv, "up"); err != nil {
		return nil, fmt.Errorf("error migrating: %w", err)
	}
	key, err := proc.RunTool(ctx, filepath.Join(sc.binDir, "billingctl"), dbEnv, "apikey", "create", "--name", "chaos",
		"--scopes", "usage:write,customers:write,billing:read,admin")
	if err != nil {
		return nil, fmt.Errorf("error creating an API key: %w", err)
	}
	s := &stack{key: lastLine(key)}

	ports := make([]int, 1+sc.apis)
	for i := range ports {
		if ports[i], err = proc.FreePort(); err != nil {
			return nil, fmt.Errorf("error finding a free port: %w", err)
		}
	}
	simURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	for _, port := range ports[1:] {
		s.apiURLs = append(s.apiURLs, fmt.Sprintf("http://127.0.0.1:%d", port))
	}
	simArgs := []string{"--addr", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--log-level", "warn"}
	if sc.simRetention > 0 {
		simArgs = append(simArgs, "--idempotency-retention", sc.simRetention.String())
	}
	s.sim = &proc.Proc{Name: "stripesim", Bin: filepath.Join(sc.binDir, "stripesim"), Args: simArgs,
		Env:     []string{"STRIPESIM_WEBHOOK_URL=" + s.apiURLs[0] + "/v1/stripe/webhooks", "STRIPESIM_WEBHOOK_SECRET=" + webhookSecret},
		LogPath: filepath.Join(sc.logDir, "stripesim.log"), Ready: simURL + "/_sim/health"}
	s.control = &stripesim.ControlClient{BaseURL: simURL}

	common := append(dbEnv,
		"TALLY_PERIOD=hour", "TALLY_CLOSE_GRACE="+closeGrace.String(), "TALLY_WORKERS=20", "TALLY_DB_MAX_CONNS=25",
		"STRIPE_API_KEY=sk_test_chaos", "STRIPE_API_BASE="+simURL, "STRIPE_WEBHOOK_SECRET="+webhookSecret,
		"STRIPE_TIMEOUT="+stripeTimeout.String(), "TALLY_STRIPE_KEY_WINDOW="+keyWindow.String(),
		"TALLY_RECONCILE_INTERVAL="+reconcileInterval.String(), "TALLY_RECONCILE_AFTER="+reconcileAfter.String(),
		"TALLY_RETRY_MAX_DELAY="+retryMaxDelay.String(), "TALLY_LOG_LEVEL=warn", "TALLY_SHUTDOWN_TIMEOUT=5s",
		"TALLY_METRICS_ADDR=off", // several replicas share the host
		"TALLY_DUNNING_SCHEDULE="+dunningSchedule, "TALLY_DUNNING_INTERVAL="+dunningInterval.String(),
		"TALLY_SWEEP_INTERVAL="+sweepInterval.String(), // the expiry of credit grants runs in the sweep
		"TALLY_WEBHOOKS_ALLOW_CIDRS=127.0.0.0/8")       // the run's webhook receiver listens on 127.0.0.1
	common = append(common, sc.env...)
	for i, url := range s.apiURLs {
		s.apis = append(s.apis, &proc.Proc{Name: fmt.Sprintf("api-%d", i), Bin: filepath.Join(sc.binDir, "server"),
			Env:     append(append([]string{}, common...), "TALLY_ROLES=api", "TALLY_HTTP_ADDR="+strings.TrimPrefix(url, "http://")),
			LogPath: filepath.Join(sc.logDir, fmt.Sprintf("api-%d.log", i)), Ready: url + "/readyz"})
	}
	for i := range sc.workers {
		s.workers = append(s.workers, &proc.Proc{Name: fmt.Sprintf("worker-%d", i), Bin: filepath.Join(sc.binDir, "server"),
			Env:     append(append([]string{}, common...), "TALLY_ROLES=worker"),
			LogPath: filepath.Join(sc.logDir, fmt.Sprintf("worker-%d.log", i))})
	}
	for _, p := range s.all() {
		if err := p.Start(); err != nil {
			s.stop()
			return nil, err
		}
	}
	for _, p := range s.all() {
		if err := p.WaitReady(ctx, 60*time.Second); err != nil {
			s.stop()
			return nil, err
		}
	}
	return s, nil
}

// all lists every process, the simulator first.
func (s *stack) all() []*proc.Proc {
	return append(append([]*proc.Proc{s.sim}, s.apis...), s.workers...)
}

// newProducer returns a producer posting to the stack's API replicas.
func (s *stack) newProducer() *producer {
	return &producer{apis: s.apiURLs, key: s.key, client: &http.Client{Timeout: 15 * time.Second}, stats: newLoadStats()}
}

// stop stops the replicas (SIGTERM, then SIGKILL), then the simulator.
func (s *stack) stop() {
	var wg sync.WaitGroup
	for _, p := range append(append([]*proc.Proc{}, s.apis...), s.workers...) {
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop(10 * time.Second) }()
	}
	wg.Wait()
	if s.sim != nil {
		s.sim.Stop(5 * time.Second)
	}
}
