package jobs_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/api"
	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/postgres"
	"github.com/tally-billing/tally/internal/stripeapi"
	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
	"github.com/tally-billing/tally/internal/webhook"
)

// testBundle is what a jobs test needs: a ledger on a fresh database, the
// Stripe simulator and a client of it, and a worker replica working the
// charge queue (crash makes it die once at a crash point).
type testBundle struct {
	*ledgertest.Bundle
	sim           *stripesim.Server
	stripe        *stripeapi.Client
	stripeTimeout time.Duration
	worker        *river.Client[pgx.Tx]
	crash         *crashOnce

	rollupInterval  time.Duration // setupOpts.rollupInterval
	dunningInterval time.Duration // setupOpts.dunningInterval
}

// setupOpts is what a test asks of setup; the zero value is a worker that
// never crashes, a 5 s Stripe timeout and no webhooks.
type setupOpts struct {
	ledger        ledger.Config // guards, for instance
	crashAt       string
	stripeTimeout time.Duration
	webhooks      bool // the simulator sends signed webhooks to Tally's API

	// rollupInterval, when set, replaces the usage roll-up's 2 s.
	rollupInterval time.Duration

	// dunningInterval, when set, replaces the dunning scan's minute.
	dunningInterval time.Duration
}

// webhookSecret signs the simulator's webhooks in tests.
const webhookSecret = "whsec_test_tally"

// setup returns a context and a testBundle on a fresh database, its worker
// started, as opts asks.
func setup(t *testing.T, opts setupOpts) (context.Context, *testBundle) {
	t.Helper()
	ctx := context.Background()
	b := ledgertest.New(t, opts.ledger)
	simConfig := stripesim.Config{Now: b.Clock.Now, WebhookSecret: webhookSecret}
	if opts.webhooks {
		apiSrv := httptest.NewServer(api.NewServer(b.Logger, b.Ledger, func(context.Context) error { return nil }, webhookSecret))
		t.Cleanup(apiSrv.Close)
		simConfig.WebhookURL = apiSrv.URL + "/v1/stripe/webhooks"
	}
	sim := stripesim.New(simConfig)
	t.Cleanup(sim.Close)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	if opts.stripeTimeout == 0 {
		opts.stripeTimeout = 5 * time.Second
	}
	stripe := stripeapi.New(stripeapi.Config{APIKey: "sk_test_tally", BaseURL: srv.URL, Timeout: opts.stripeTimeout})
	crash := &crashOnce{point: opts.crashAt}
	bundle := &testBundle{Bundle: b, sim: sim, stripe: stripe, stripeTimeout: opts.stripeTimeout, crash: crash,
		rollupInterval: opts.rollupInterval, dunningInterval: opts.dunningInterval}
	bundle.worker = bundle.startWorker(t, ctx)
	return ctx, bundle
}

// startWorker starts one worker replica (a River client working the charge
// queue) and stops it when the test ends.
func (b *testBundle) startWorker(t *testing.T, ctx context.Context) *river.Client[pgx.Tx] {
	t.Helper()
	config := jobs.WorkerConfig{
		Ledger: b.Ledger, Stripe: b.stripe, StripeTimeout: b.stripeTimeout, Concurrency: 10,
		Logger: b.Logger, RetryPolicy: fastRetry{},
		DeliveryAllow:       webhook.LoopbackNetworks(), // the tests' webhook receivers listen on 127.0.0.1
		UsageRollupInterval: b.rollupInterval,
		DunningInterval:     b.dunningInterval,
	}
	jobs.SetCrashHook(&config, b.crash.hook)
	jobs.SetRetryLaterSnooze(&config, 200*time.Millisecond)
	// River on a pool of its own, as the server runs it.
	queuePool, err := postgres.ConnectQueue(ctx, b.URL, "tally-test-queue", 8)
	require.NoError(t, err)
	client, err := jobs.NewWorkerClient(queuePool, config)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
		queuePool.Close()
	})
	return client
}

// crashOnce makes the worker "die" once at one crash point.
type crashOnce struct {
	mu      sync.Mutex
	point   string
	crashed bool
}

func (c *crashOnce) hook(point string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.point == point && !c.crashed {
		c.crashed = true
		return jobs.ErrCrash
	}
	return nil
}

// arm sets the crash point now, for a crash at a later pass of the path.
func (c *crashOnce) arm(point string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.point, c.crashed = point, false
}

func (c *crashOnce) done() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.crashed
}

// waitCrashed waits until the run crashed at its crash point, so that what
// it committed before is visible to what the test reads next.
func (b *testBundle) waitCrashed(t *testing.T) {
	t.Helper()
	require.Eventually(t, b.crash.done, 30*time.Second, 10*time.Millisecond, "the run never reached its crash point")
}

// fastRetry retries a failed job after 100 ms instead of River's backoff.
type fastRetry struct{}

func (fastRetry) NextRetry(*rivertype.JobRow) time.Time {
	return time.Now().Add(100 * time.Millisecond)
}
