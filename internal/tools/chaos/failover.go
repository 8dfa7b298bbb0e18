package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/proc"
)

// FailoverConfig sizes a failover drill. ShortFailoverConfig and
// LongFailoverConfig are the two variants; Seed, Customers, Stall,
// QuiesceMax, WorkDir and RepoDir (unless BinDir is set) are required.
type FailoverConfig struct {
	// Seed chooses the events' amounts and times and which customers' Stripe
	// calls are slow.
	Seed int64

	// Customers is the number of customers, each with a few usage events in
	// the period closed during the stall.
	Customers int

	// Sync makes the replication synchronous (synchronous_standby_names
	// '*'): commits wait for the standby, so the failover must lose nothing
	// that was acknowledged. False is the lossy, asynchronous drill.
	Sync bool

	// HA runs the drill on the pg_auto_failover formation of scripts/ha.sh
	// instead of two clusters and the drill's proxies: the stall stops the
	// primary's WAL senders, the kill is the primary's node dying, and the
	// monitor promotes the secondary (RepoDir is required).
	HA bool

	// Stall is how long replication is stalled before the primary dies,
	// while periods are closed and charged and new events are posted.
	Stall time.Duration

	// ReCloseAfter is how long after the switch to the promoted standby the
	// previous period is closed again (the producers go on meanwhile), as a
	// scheduler or an operator would notice later that the closes were
	// lost. Zero closes again at once. The simulator forgets a key
	// simRetention after its first use while Tally trusts it for keyWindow
	// after the first attempt it has a record of, so a charge's key is
	// re-used past the simulator's memory only when Stall plus ReCloseAfter
	// (roughly) exceeds simRetention - keyWindow (5 s): with less, a charge
	// path that trusts a key it has no record of goes unnoticed.
	ReCloseAfter time.Duration

	// QuiesceMax bounds the wait, after the failover, for every charge and
	// job to settle.
	QuiesceMax time.Duration

	// RepoDir is the module root the binaries are built from.
	RepoDir string

	// BinDir, when set, holds the four commands already built (see
	// proc.Build) and RepoDir is not used; empty means build them into
	// WorkDir/bin.
	BinDir string

	// WorkDir holds the binaries, both Postgres clusters and every process's
	// log (WorkDir/logs).
	WorkDir string

	// Out receives progress lines; nil discards them.
	Out io.Writer
}

// ShortFailoverConfig is the variant inside make test: 32 customers, a 3 s
// stall and the closes issued again 3 s after the failover; well under a
// minute.
func ShortFailoverConfig(seed int64, sync bool) FailoverConfig {
	return FailoverConfig{Seed: seed, Customers: 32, Sync: sync, Stall: 3 * time.Second, ReCloseAfter: 3 * time.Second,
		QuiesceMax: 3 * time.Minute}
}

// LongFailoverConfig is make failover: 150 customers, a 4 s stall and the
// closes issued again 3 s after the failover.
func LongFailoverConfig(seed int64, sync bool) FailoverConfig {
	return FailoverConfig{Seed: seed, Customers: 150, Sync: sync, Stall: 4 * time.Second, ReCloseAfter: 3 * time.Second,
		QuiesceMax: 5 * time.Minute}
}

func (c *FailoverConfig) validate() error {
	switch {
	case c.Customers <= 0:
		return errors.New("FailoverConfig.Customers must be positive")
	case c.Stall <= 0:
		return errors.New("FailoverConfig.Stall must be positive")
	case c.ReCloseAfter < 0:
		return errors.New("FailoverConfig.ReCloseAfter must not be negative")
	case c.QuiesceMax <= 0:
		return errors.New("FailoverConfig.QuiesceMax must be positive")
	case c.WorkDir == "":
		return errors.New("FailoverConfig.WorkDir is required")
	case c.RepoDir == "" && c.BinDir == "":
		return errors.New("FailoverConfig.RepoDir is required unless BinDir is set")
	case c.RepoDir == "" && c.HA:
		return errors.New("FailoverConfig.RepoDir is required with HA (scripts/ha.sh)")
	}
	return nil
}

// Timings of the drill.
const (
	// failoverProducers post new events concurrently during the stall,
	// each pausing failoverPostPause between posts.
	failoverProducers = 4
	failoverPostPause = 20 * time.Millisecond

	// failoverSlowCustomers is how many customers' first PaymentIntent
	// creation takes stripeLatency (past the timeout), so their calls are
	// in flight when the primary dies, at most one customer in five.
	failoverSlowCustomers = 8

	// simRetention is how long the simulator keeps an idempotency key:
	// just past Tally's key window, as Stripe's 24 h is just past Tally's
	// 23 h, so a key Tally lost track of is forgotten soon after.
	simRetention = keyWindow + 5*time.Second
)

// failover is the state of one drill.
type failover struct {
	cfg    FailoverConfig
	rnd    *rand.Rand
	mode   string
	binDir string
	logDir string
	db     failoverDB
	stack  *stack
	prod   *producer
	report *FailoverReport

	customers []string
	h0, prev  time.Time // the current hour, and the period closed during the stall

	phaseName  string
	phaseStart time.Time

	// bgCtx is the context of the work running in the background (the
	// producers and the closes issued during the stall); teardown cancels
	// it and waits for bg.
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup

	// prodStop, closed by stopProducers, asks the producers to stop after
	// their post in flight.
	prodStop     chan struct{}
	prodStopOnce sync.Once

	rndMu      sync.Mutex                // f.rnd is shared with the producers
	stallAt    time.Time                 // replication paused
	killAt     atomic.Pointer[time.Time] // primary dead (read by the producers)
	switchedAt time.Time                 // app proxy switched to the promoted standby
	eventN     atomic.Int64
	ackMu      sync.Mutex
	acked      map[string]int64 // customer/event → amount acknowledged with 2xx
	ackedAt    map[string]time.Time
}

func (f *failover) logf(format string, args ...any) {
	fmt.Fprintf(f.cfg.Out, "failover %s %s: %s\n", f.mode, time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// phase ends the current phase (recording its duration) and starts the
// next one; an empty name only ends it.
func (f *failover) phase(name string) {
	now := time.Now()
	if f.phaseName != "" {
		f.report.Phases = append(f.report.Phases, FailoverPhase{Name: f.phaseName, Duration: now.Sub(f.phaseStart)})
	}
	f.phaseName, f.phaseStart = name, now
	if name != "" {
		f.logf("phase %s", name)
	}
}

// RunFailover performs one failover drill and returns its report; see
// doc.go for what it does. An error means the drill itself could not be
// carried out; violations of the promise are in the report. Every process
// and both clusters are stopped before it returns.
func RunFailover(ctx context.Context, cfg FailoverConfig) (*FailoverReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	start := time.Now()
	f := &failover{cfg: cfg, rnd: rand.New(rand.NewPCG(uint64(cfg.Seed), 0xfa11)), mode: "async",
		acked: map[string]int64{}, ackedAt: map[string]time.Time{}}
	if cfg.Sync {
		f.mode = "sync"
	}
	f.bgCtx, f.bgCancel = context.WithCancel(ctx)
	f.prodStop = make(chan struct{})
	f.report = &FailoverReport{Seed: cfg.Seed, Mode: f.mode, Engine: "proxies", Customers: cfg.Customers, Stall: cfg.Stall, ReCloseAfter: cfg.ReCloseAfter}
	if cfg.HA {
		f.report.Engine = "pg_auto_failover"
	}
	f.logf("seed %d: %d customers, stall %s, closes again %s after the failover", cfg.Seed, cfg.Customers, cfg.Stall, cfg.ReCloseAfter)

	defer f.teardown()
	f.phase("setup")
	if err := f.setup(ctx); err != nil {
		return nil, err
	}

	f.phase("load")
	if err := f.load(ctx); err != nil {
		return nil, err
	}
	f.phase("stall")
	if err := f.stall(ctx); err != nil {
		return nil, err
	}
	f.phase("failover")
	if err := f.failover(ctx); err != nil {
		return nil, err
	}
	f.phase("recovery")
	quiet := f.recover(ctx)
	f.phase("check")
	if err := f.check(ctx, quiet); err != nil {
		return nil, err
	}
	f.phase("")
	f.report.Duration = time.Since(start)
	return f.report, nil
}

// setup builds the binaries, starts the primary, the replication proxy and
// the standby (synchronous if asked), the app proxy, and Tally's
// processes: one API and two worker replicas and the simulator.
func (f *failover) setup(ctx context.Context) error {
	f.logDir = filepath.Join(f.cfg.WorkDir, "logs")
	if err := os.MkdirAll(f.logDir, 0o755); err != nil {
		return fmt.Errorf("error creating the log directory: %w", err)
	}
	f.binDir = f.cfg.BinDir
	if f.binDir == "" {
		var err error
		if f.binDir, err = proc.Commands(ctx, f.cfg.RepoDir); err != nil {
			return err
		}
	}
	f.db = &clusterPair{}
	if f.cfg.HA {
		f.db = &formationPair{repoDir: f.cfg.RepoDir}
	}
	dbURL, err := f.db.start(ctx, f.cfg.WorkDir, f.logDir, f.cfg.Sync)
	if err != nil {
		return err
	}
	f.logf("%s (sync %t)", f.db.describe(), f.cfg.Sync)
	if f.stack, err = newStack(ctx, stackConfig{binDir: f.binDir, logDir: f.logDir, dbURL: dbURL,
		apis: 1, workers: 2, simRetention: simRetention}); err != nil {
		return err
	}
	f.prod = f.stack.newProducer()
	f.logf("stack up: api %v, simulator %s, database %s", f.stack.apiURLs, f.stack.control.BaseURL, dbURL)
	return nil
}

// teardown stops the processes, the proxies and both clusters, whatever
// state they are in.
func (f *failover) teardown() {
	f.bgCancel()
	f.stopProducers()
	f.bg.Wait()
	if f.stack != nil {
		f.stack.stop()
	}
	if f.db != nil {
		f.db.stop()
	}
}

// load creates the customers, posts a few events for each in the previous
// hour, and waits until the standby has replayed all of it.
func (f *failover) load(ctx context.Context) error {
	f.h0 = time.Now().UTC().Truncate(time.Hour)
	f.prev = f.h0.Add(-time.Hour)
	var events []*plannedEvent
	for i := range f.cfg.Customers {
		c := fmt.Sprintf("c-%04d", i)
		f.customers = append(f.customers, c)
		for range 1 + f.rnd.IntN(4) {
			events = append(events, f.newEvent(c, f.prev, time.Hour))
		}
	}
	if err := f.parallel(ctx, 8, len(f.customers), func(i int) error {
		ans, err := f.prod.do(ctx, http.MethodPut, "/v1/customers/"+f.customers[i], 0,
			map[string]any{"stripe_customer_id": fmt.Sprintf("cus_failover_%04d", i), "currency": "usd"})
		if err == nil && ans.status/100 != 2 {
			err = fmt.Errorf("%d %s", ans.status, ans.code)
		}
		if err != nil {
			return fmt.Errorf("error creating customer %s: %w", f.customers[i], err)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := f.parallel(ctx, 8, len(events), func(i int) error {
		if !f.post(ctx, events[i]) {
			return fmt.Errorf("event %s of %s was not acknowledged", events[i].id, events[i].customer)
		}
		return nil
	}); err != nil {
		return err
	}
	lsn, err := waitReplayed(ctx, f.db.primaryURL(), f.db.standbyURL())
	if err != nil {
		return err
	}
	f.logf("%d customers, %d events in %s; standby replayed up to %s", len(f.customers), len(events), f.label(f.prev), lsn)
	return nil
}

// newEvent makes an event of customer occurring in [start, start+span),
// never in the future.
func (f *failover) newEvent(customer string, start time.Time, span time.Duration) *plannedEvent {
	span = min(span, time.Since(start))
	n := f.eventN.Add(1)
	f.rndMu.Lock()
	occurred := start.Add(time.Duration(f.rnd.Int64N(int64(max(span, time.Second)))))
	amount := 100 + f.rnd.Int64N(4900)
	f.rndMu.Unlock()
	if occurred.After(time.Now()) {
		occurred = time.Now()
	}
	return &plannedEvent{id: fmt.Sprintf("ev-%06d", n), customer: customer, period: f.label(start), amount: amount, occurredAt: occurred}
}

// post posts one event and records whether, and when, it was acknowledged.
func (f *failover) post(ctx context.Context, e *plannedEvent) bool {
	f.prod.stats.posts.Add(1)
	ans, err := f.prod.do(ctx, http.MethodPost, "/v1/usage-events", 0, e.body(e.amount))
	if err != nil || ans.status/100 != 2 {
		return false
	}
	f.ackMu.Lock()
	defer f.ackMu.Unlock()
	f.acked[e.customer+"/"+e.id] = e.amount
	f.ackedAt[e.customer+"/"+e.id] = time.Now()
	return true
}

func (f *failover) label(t time.Time) string { return t.Format("2006-01-02T15") }

// parallel runs do(0..n-1) with at most width at once and returns the
// first error.
func (f *failover) parallel(ctx context.Context, width, n int, do func(i int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, width)
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := do(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// closeAll closes period label of every customer through the admin API and
// returns how many closes were answered 200 before the primary died and
// after. A customer without events in it answers 404, which is fine.
func (f *failover) closeAll(ctx context.Context, label string) (before, after int) {
	var mu sync.Mutex
	_ = f.parallel(ctx, 8, len(f.customers), func(i int) error {
		ans, err := f.prod.do(ctx, http.MethodPost, "/v1/customers/"+f.customers[i]+"/periods/"+label+"/close", 0, map[string]any{})
		if err != nil || ans.status != http.StatusOK {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if k := f.killAt.Load(); k == nil {
			before++
		} else {
			after++
		}
		return nil
	})
	return before, after
}

// stall arranges the Stripe faults, stalls replication, closes the previous
// period of every customer (the workers charge on the primary alone) while
// producers post new events for the current hour, and waits cfg.Stall. The
// closes and the producers go on in the background (f.bg) until recover
// stops the producers and waits for both.
func (f *failover) stall(ctx context.Context) error {
	// The first PaymentIntent creation of each charge moves the money and
	// answers 500: Tally records the outcome as unknown, and the key then
	// replays the stored 500 until the simulator forgets it.
	if err := f.stack.control.FaultAdd(ctx, stripesim.Fault{Customer: stripesim.FaultCustomerAll,
		Kind: stripesim.FaultKindError500AfterCreate, Count: f.cfg.Customers}); err != nil {
		return fmt.Errorf("error adding the 500-after-create fault: %w", err)
	}
	// A few creations take longer than the timeout: still in flight, or
	// answered only on the simulator's side, when the primary dies.
	slow := min(failoverSlowCustomers, max(1, f.cfg.Customers/5))
	for _, i := range f.rnd.Perm(f.cfg.Customers)[:slow] {
		if err := f.stack.control.FaultAdd(ctx, stripesim.Fault{Customer: fmt.Sprintf("cus_failover_%04d", i),
			Kind: stripesim.FaultKindLatency, Count: 1, Latency: stripeLatency}); err != nil {
			return fmt.Errorf("error adding a latency fault: %w", err)
		}
	}
	f.report.SlowCustomers = slow

	if err := f.db.stall(ctx); err != nil {
		return err
	}
	f.stallAt = time.Now()
	f.logf("replication stalled; closing %s for every customer and posting events for %s", f.label(f.prev), f.label(f.h0))
	f.startProducers()
	f.bg.Add(1)
	go func() {
		defer f.bg.Done()
		f.report.ClosesAckedInStall, _ = f.closeAll(f.bgCtx, f.label(f.prev))
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.cfg.Stall):
	}
	return nil
}

// startProducers starts failoverProducers goroutines posting new events
// for the current hour, one at a time, until stopProducers (or teardown).
func (f *failover) startProducers() {
	for range failoverProducers {
		f.bg.Add(1)
		go func() {
			defer f.bg.Done()
			for {
				f.rndMu.Lock()
				c := f.customers[f.rnd.IntN(len(f.customers))]
				f.rndMu.Unlock()
				// A stop does not cut the post in flight short: it ends
				// with an answer, as a real producer's would. Only
				// teardown cancels it.
				f.post(f.bgCtx, f.newEvent(c, f.h0, time.Hour))
				select {
				case <-f.prodStop:
					return
				case <-f.bgCtx.Done():
					return
				case <-time.After(failoverPostPause):
				}
			}
		}()
	}
}

// stopProducers asks the producers to stop after their post in flight; it
// is safe to call more than once. bg.Wait waits for them.
func (f *failover) stopProducers() {
	f.prodStopOnce.Do(func() { close(f.prodStop) })
}

// failover snapshots what the primary knows, kills it (immediate stop),
// cuts the replication proxy, promotes the standby and switches the app
// proxy to it. The replicas reconnect by themselves.
func (f *failover) failover(ctx context.Context) error {
	// What the primary knows, just before it dies (best effort: these
	// figures only inform the report).
	lsn, lsnErr := walPosition(ctx, f.db.primaryURL())
	f.report.ChargesAtKill, _ = chargeCounts(ctx, strings.Replace(f.db.primaryURL(), "/postgres?", "/tally?", 1))
	if pis, err := f.stack.control.PaymentIntentList(ctx); err == nil {
		f.report.PaymentIntentsAtKill = len(pis)
	}
	killAt := time.Now()
	if err := f.db.kill(ctx); err != nil {
		return err
	}
	// From here on no answer can come from the old primary: what is
	// acknowledged before is "in the stall", what comes after is not.
	killed := time.Now()
	f.killAt.Store(&killed)
	f.logf("primary killed; promoting the standby")
	if err := f.db.promote(ctx); err != nil {
		return err
	}
	f.switchedAt = time.Now()
	f.report.FailoverTook = f.switchedAt.Sub(killAt)
	f.report.ChargesAfterPromote, _ = chargeCounts(ctx, f.db.tallyURL())
	if lsnErr == nil { // the last position recovery replayed, all it had received
		if behind, err := walBehind(ctx, f.db.standbyURL(), lsn); err == nil {
			f.report.WALLostBytes = behind
		}
	}
	f.logf("standby promoted and serving after %s", f.report.FailoverTook.Round(time.Millisecond))
	return nil
}

// recover waits cfg.ReCloseAfter while the producers go on, closes the
// previous period again for every customer (the closes answered during the
// stall may be lost), stops the producers, closes the current period, and
// waits for quiescence. It returns the quiescence error, if any.
func (f *failover) recover(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(f.switchedAt.Add(f.cfg.ReCloseAfter))):
	}
	f.logf("closing %s again for every customer", f.label(f.prev))
	_, f.report.ClosesAfter = f.closeAll(ctx, f.label(f.prev))
	f.stopProducers()
	f.bg.Wait() // the producers, and the closes issued during the stall
	f.logf("producers stopped; closing %s for every customer", f.label(f.h0))
	f.closeAll(ctx, f.label(f.h0))
	return waitQuiescent(ctx, f.db.tallyURL(), f.cfg.QuiesceMax, f.logf)
}

// chargeCounts counts the charges of the database at dbURL by status.
func chargeCounts(ctx context.Context, dbURL string) (map[string]int, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("error connecting to count charges: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT status, count(*) FROM billing.charges GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("error counting charges: %w", err)
	}
	counts := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("error counting charges: %w", err)
		}
		counts[s] = n
	}
	return counts, rows.Err()
}
