// Package ledgertest builds a Ledger on a fresh test database for tests in
// other packages: a controllable clock, an insert-only River client for the
// charge jobs, and helpers to create customers and plans.
package ledgertest

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// Clock is a settable clock for tests.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Resolver resolves host names for tests without sending a packet: it
// answers the names set, and fails for any other.
type Resolver struct {
	mu    sync.Mutex
	hosts map[string][]netip.Addr
}

// ExampleAddr is a public address, what the bundle's Resolver answers for
// example.com until told otherwise.
var ExampleAddr = netip.MustParseAddr("93.184.215.14")

// NewResolver returns a Resolver answering ExampleAddr for example.com.
func NewResolver() *Resolver {
	return &Resolver{hosts: map[string][]netip.Addr{"example.com": {ExampleAddr}}}
}

// Set makes r answer addrs for host from now on.
func (r *Resolver) Set(host string, addrs ...netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hosts[host] = addrs
}

// LookupNetIP answers the addresses set for host.
func (r *Resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	addrs, ok := r.hosts[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host (ledgertest.Resolver)", Name: host, IsNotFound: true}
	}
	return addrs, nil
}

// Bundle is what a ledger test needs.
type Bundle struct {
	Ledger   *ledger.Ledger
	Pool     *pgxpool.Pool
	URL      string
	Clock    *Clock
	River    *river.Client[pgx.Tx]
	Logger   *slog.Logger
	Resolver *Resolver // the ledger's WebhooksResolver, unless config set one
}

// ClockStart is where every test clock starts: mid-month, mid-day, so each
// cadence's current period is comfortably open.
var ClockStart = time.Date(2026, 11, 14, 10, 30, 0, 0, time.UTC)

// New returns a Bundle on a fresh database. config's zero fields get test
// defaults (the bundle's clock, its River client as charge scheduler, its
// Resolver, so no test looks a name up in the DNS).
func New(t testing.TB, config ledger.Config) *Bundle {
	t.Helper()
	pool, url := testdb.New(t)
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	client, err := jobs.NewInsertClient(pool, logger)
	require.NoError(t, err)
	clock := NewClock(ClockStart)
	if config.Clock == nil {
		config.Clock = clock.Now
	}
	if config.Scheduler == nil {
		config.Scheduler = jobs.Scheduler{Client: client}
	}
	if config.Logger == nil {
		config.Logger = logger
	}
	resolver := NewResolver()
	if config.WebhooksResolver == nil {
		config.WebhooksResolver = resolver
	}
	l, err := ledger.New(pool, config)
	require.NoError(t, err)
	return &Bundle{Ledger: l, Pool: pool, URL: url, Clock: clock, River: client, Logger: logger, Resolver: resolver}
}

// Customer creates a customer with id, a Stripe id derived from it, and
// currency usd.
func (b *Bundle) Customer(t testing.TB, id string) *ledger.Customer {
	t.Helper()
	c, _, err := b.Ledger.CustomerPut(context.Background(), ledger.CustomerPutParams{
		ID: id, StripeCustomerID: "cus_" + id, Currency: "usd",
	})
	require.NoError(t, err)
	return c
}

// Count returns the single int64 that query returns.
func (b *Bundle) Count(t testing.TB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.Pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// Plan puts plan id with the price book in JSON (as PUT /v1/plans/{id}
// takes it), by actor "test", and returns the version it is now at.
func (b *Bundle) Plan(t testing.TB, id, priceBook string) *ledger.PlanVersion {
	t.Helper()
	plan, err := pricing.ParsePlan([]byte(priceBook))
	require.NoError(t, err)
	v, _, err := b.Ledger.PlanPut(context.Background(), ledger.PlanPutParams{PlanID: id, Plan: plan, Actor: "test"})
	require.NoError(t, err)
	return v
}

// Rollup runs usage roll-ups (ledger.UsageRollup) until they hold every
// event and void committed before it was called, and returns the usage
// thresholds they recorded. Whether a roll-up may add an id depends on
// every transaction of the cluster that began before it (other tests'
// included), so it retries, within a bound.
func (b *Bundle) Rollup(t testing.TB, ctx context.Context) int {
	t.Helper()
	lastEvent := b.Count(t, `SELECT coalesce(max(id), 0) FROM billing.usage_events`)
	lastVoid := b.Count(t, `SELECT coalesce(max(id), 0) FROM billing.usage_event_voids`)
	var thresholds int
	for deadline := time.Now().Add(30 * time.Second); ; {
		res, err := b.Ledger.UsageRollup(ctx)
		require.NoError(t, err)
		thresholds += res.Thresholds
		if b.Count(t, `SELECT count(*) FROM billing.usage_rollup_watermark WHERE event_id >= $1 AND void_id >= $2`,
			lastEvent, lastVoid) == 1 {
			return thresholds
		}
		require.True(t, time.Now().Before(deadline), "the roll-ups did not reach event %d and void %d", lastEvent, lastVoid)
		time.Sleep(10 * time.Millisecond)
	}
}
