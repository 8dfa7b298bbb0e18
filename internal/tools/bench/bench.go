// Package bench is `make bench` (tools/bench): in one run against one
// Postgres it measures raw baselines — what Postgres and River do with no
// Tally in the way — and Tally through real HTTP against real server
// processes, and compares them as ratios. The machine drifts, so a phase
// and its baseline run in alternating windows (ABAB…, pairs.go), three
// rounds, and a target's ratio is the median of the rounds' ratios.
//
// The rotations, in order:
//
//	raw_sql, raw_sql_pipelined, ingest_spread, ingest_hot
//	    raw_sql: clients × (one event row + one river_job-shaped outbox row per
//	    transaction: BEGIN, 2 INSERTs, COMMIT) on copies of Tally's tables;
//	    pipelined: the two INSERTs in one round trip (pgx.Batch); then a
//	    server (TALLY_ROLES=api) on a fresh database: clients post single
//	    events spread over the customers, then all to one customer (hot)
//	ingest_serial_ungrouped, ingest_serial
//	    one client posting single events, to a server that writes every event
//	    alone (TALLY_INGEST_GROUP_MAX=1), then to the grouping one
//	ingest_rollups_off, ingest_rollups
//	    every customer with three usage thresholds, a worker replica not
//	    rolling up, then one rolling usage up every 2 s
//	raw_copy, ingest_batch
//	    2 writers × CopyFrom of 1,000 event rows, then 2 clients posting
//	    batches of 1,000 events
//	raw_sql_after_load, ingest_after_load
//	    once LoadEvents are loaded through the batch API (same server, never
//	    restarted), raw_sql and ingest_spread again: judged as the ratio of
//	    their ratio to ingest_spread's to raw_sql
//	usage_query
//	    a fresh database and server (api,worker): one customer-period of
//	    LoadEvents events, rolled up; GET /v1/customers/{id}/usage, one client
//	river_noop, charges
//	    an in-process River client with a no-op worker working N jobs, then
//	    on a fresh database, the Stripe simulator and a server with
//	    TALLY_ROLES=api,worker: N periods closing at the same moment
//	closes, closes_credits
//	    periods closed through the API without credits, then with two grants
//
// Two flags add variants to these rotations, measured in the same windows
// as the phase they are judged against (--only names that phase):
//
//	--pgbouncer: ingest_spread_pgbouncer, ingest_batch_pgbouncer,
//	charges_pgbouncer
//	    servers whose pools go through PgBouncer in transaction mode;
//	    target ≥ 0.8× the direct phase
//	--preload N: ingest_spread_preloaded, ingest_batch_preloaded,
//	charges_preloaded (each round), closes_preloaded
//	    servers on a ledger of N events of past, closed periods (10,000
//	    customers × the 12 months of 2025), built once per run in a
//	    template database (tally_bench_<hex>_preload_tpl: migrated,
//	    preloaded with set-based SQL, rolled up by a worker, VACUUM
//	    (ANALYZE), CHECKPOINT) that each of their databases is cloned
//	    from (CREATE DATABASE … TEMPLATE) and dropped after its phase;
//	    target ≥ 0.9× the same phase on an empty ledger. The report adds
//	    the ledger's figures: how long the template took, usage_events'
//	    size (heap and indexes, summed over its partitions, read from
//	    pg_inherits) and its largest index, VACUUM of its partition with
//	    the most rows after the ingest phases, and GET
//	    /v1/customers/{id}/usage of a preloaded customer beside one on the
//	    empty ledger (preload.go)
//
// Every run creates its own databases (tally_bench_<hex>_…) and drops them
// at the end; the servers are the binaries of the repository, built into a
// work directory, bound to 127.0.0.1.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/schema"
	"github.com/tally-billing/tally/internal/tools/pgbouncer"
	"github.com/tally-billing/tally/internal/tools/proc"
)

// Phase names, in the order they run.
const (
	PhaseRawSQL          = "raw_sql"
	PhaseRawSQLPipelined = "raw_sql_pipelined"
	PhaseRawCopy         = "raw_copy"
	PhaseRiverNoop       = "river_noop"
	PhaseIngestSpread    = "ingest_spread"
	PhaseIngestRollups   = "ingest_rollups"

	// PhaseIngestRollupsOff is ingest_rollups' paired baseline, measured
	// within it (not a phase of its own: --only ingest_rollups).
	PhaseIngestRollupsOff = "ingest_rollups_off"
	PhaseIngestHot        = "ingest_hot"

	// PhaseIngestSerialAlone is ingest_serial's paired baseline, measured
	// within it: a server that writes every single event alone
	// (TALLY_INGEST_GROUP_MAX=1).
	PhaseIngestSerialAlone = "ingest_serial_ungrouped"
	PhaseIngestSerial      = "ingest_serial"
	PhaseIngestBatch       = "ingest_batch"

	// PhaseRawSQLAfterLoad is raw_sql again, in the windows between
	// ingest_after_load's (not a phase of its own).
	PhaseRawSQLAfterLoad = "raw_sql_after_load"
	PhaseIngestAfterLoad = "ingest_after_load"
	PhaseUsageQuery      = "usage_query"
	PhaseCharges         = "charges"

	// PhaseCloses is closes_credits' paired baseline, measured within it
	// (not a phase of its own: --only closes_credits).
	PhaseCloses        = "closes"
	PhaseClosesCredits = "closes_credits"

	// With --pgbouncer, ingest_spread, ingest_batch and charges are
	// measured again by servers whose pools go through PgBouncer in
	// transaction mode (TALLY_POOLER_URL), in the same rotations: these
	// are not phases of their own (--only names the direct one).
	PhaseIngestSpreadPooled = "ingest_spread_pgbouncer"
	PhaseIngestBatchPooled  = "ingest_batch_pgbouncer"
	PhaseChargesPooled      = "charges_pgbouncer"

	// With --preload N, ingest_spread, ingest_batch, charges and closes
	// are measured again by servers on clones of a preloaded ledger
	// (preload.go), in the same rotations: not phases of their own either
	// (--only names the empty-ledger one; closes_credits for closes).
	PhaseIngestSpreadPreloaded = "ingest_spread_preloaded"
	PhaseIngestBatchPreloaded  = "ingest_batch_preloaded"
	PhaseChargesPreloaded      = "charges_preloaded"
	PhaseClosesPreloaded       = "closes_preloaded"
)

// Phases lists every phase in the order a run performs them.
var Phases = []string{
	PhaseRawSQL, PhaseRawSQLPipelined, PhaseIngestSpread, PhaseIngestSpreadPooled, PhaseIngestSpreadPreloaded, PhaseIngestHot,
	PhaseIngestSerialAlone, PhaseIngestSerial, PhaseIngestRollupsOff, PhaseIngestRollups,
	PhaseRawCopy, PhaseIngestBatch, PhaseIngestBatchPooled, PhaseIngestBatchPreloaded, PhaseRawSQLAfterLoad, PhaseIngestAfterLoad,
	PhaseUsageQuery, PhaseRiverNoop, PhaseCharges, PhaseChargesPooled, PhaseChargesPreloaded,
	PhaseCloses, PhaseClosesCredits, PhaseClosesPreloaded,
}

// ingestPhases are the phases the ingest step measures.
var ingestPhases = []string{
	PhaseRawSQL, PhaseRawSQLPipelined, PhaseIngestSpread, PhaseIngestHot, PhaseIngestSerial, PhaseIngestRollups,
	PhaseRawCopy, PhaseIngestBatch, PhaseIngestAfterLoad,
}

// Fixed shapes of the workload.
const (
	batchSize    = 1000                    // events per batch (the API's maximum) and rows per COPY
	copyWriters  = 2                       // raw_copy and ingest_batch clients
	loadClients  = 4                       // clients loading events before ingest_after_load
	workersTally = jobs.ConcurrencyDefault // cmd/server's TALLY_WORKERS default
)

// Config configures a run. DefaultConfig and ShortConfig give complete ones.
type Config struct {
	// AdminURL is a postgres:// URL of a role allowed to CREATE DATABASE.
	AdminURL string
	// ServerRepoDir, when set, is another checkout of Tally (git worktree
	// add DIR COMMIT) that the server, stripesim, billingctl and migrate are
	// built from, to measure that commit with this bench. Default RepoDir.
	ServerRepoDir string
	// RepoDir is the module root: the binaries are built from it, and git
	// describes the commit measured.
	RepoDir string
	// WorkDir receives the servers' logs; empty: a
	// temporary directory, removed at the end unless Keep.
	WorkDir string

	// Short marks a quick run whose figures are not asserted.
	Short bool
	// Duration is how long each timed phase posts.
	Duration time.Duration
	// Clients is the number of concurrent clients of raw_sql and the single
	// event ingest phases.
	Clients int
	// Workers is River's MaxWorkers in river_noop and TALLY_WORKERS of every
	// server, so both sides use the same count.
	Workers int
	// Charges is the number of periods closed at once (charges), and of jobs
	// worked by river_noop.
	Charges int
	// LoadEvents is how many events are loaded before ingest_after_load.
	LoadEvents int
	// Customers is the number of customers events are spread over.
	Customers int
	// Preload, when positive, is how many events of past, closed periods
	// the preloaded ledger holds: built once per run in a template
	// database (preload.go), cloned for servers that measure
	// ingest_spread, ingest_batch, charges and closes again on it
	// (*_preloaded), beside the same phases on an empty ledger, to
	// measure how costs grow with the ledger's size (docs/scaling.md).
	Preload int
	// WorkerReplicas is the number of worker replicas of the charges phase:
	// api,worker servers on one database, the events posted to the first.
	WorkerReplicas int
	// Only, when not empty, names the phases to run; the others are skipped
	// and the targets that need them are not judged.
	Only []string
	// Keep keeps the databases (and WorkDir) for a look afterwards.
	Keep bool
	// PgBouncer measures ingest_spread, ingest_batch and charges also
	// through a PgBouncer in transaction mode, started by the run
	// (internal/tools/pgbouncer), beside the direct figures.
	PgBouncer bool

	// Command is the command line shown in the report's header.
	Command string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// DefaultConfig is the full run of make bench.
func DefaultConfig() Config {
	return Config{Duration: 10 * time.Second, Clients: 16, Workers: workersTally, Charges: 1000,
		LoadEvents: 1_000_000, Customers: 1000, WorkerReplicas: 1}
}

// ShortConfig is a quick run: a few seconds a phase, small counts, nothing
// asserted.
func ShortConfig() Config {
	c := DefaultConfig()
	c.Short, c.Duration, c.Charges, c.LoadEvents = true, 3*time.Second, 100, 20_000
	return c
}

// validate checks the configuration.
func (c *Config) validate() error {
	var errs []error
	if c.AdminURL == "" {
		errs = append(errs, errors.New("no admin URL: set TALLY_TEST_ADMIN_DATABASE_URL or --admin-url"))
	} else if u, err := url.Parse(c.AdminURL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		errs = append(errs, fmt.Errorf("admin URL %q is not a postgres:// URL", c.AdminURL))
	}
	if c.RepoDir == "" {
		errs = append(errs, errors.New("no repository directory"))
	}
	if c.Preload < 0 {
		errs = append(errs, fmt.Errorf("preload %d: must not be negative", c.Preload))
	}
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("duration %s: must be positive", c.Duration))
	}
	for name, v := range map[string]int{"clients": c.Clients, "workers": c.Workers, "charges": c.Charges,
		"load-events": c.LoadEvents, "customers": c.Customers, "worker-replicas": c.WorkerReplicas} {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s %d: must be positive", name, v))
		}
	}
	for _, p := range c.Only {
		if direct, ok := strings.CutSuffix(p, pooledSuffix); ok && slices.Contains(Phases, p) {
			errs = append(errs, fmt.Errorf("unknown phase %q: name %s and add --pgbouncer", p, direct))
			continue
		}
		if base, ok := preloadedBase(p); ok && slices.Contains(Phases, p) {
			errs = append(errs, fmt.Errorf("unknown phase %q: name %s and add --preload N", p, base))
			continue
		}
		if !slices.Contains(Phases, p) {
			errs = append(errs, fmt.Errorf("unknown phase %q: want one of %s", p, strings.Join(Phases, ", ")))
		}
	}
	return errors.Join(errs...)
}

// pooledSuffix ends the name of a phase measured through PgBouncer, and
// preloadedSuffix of one measured on the preloaded ledger.
const (
	pooledSuffix    = "_pgbouncer"
	preloadedSuffix = "_preloaded"
)

// preloadedBase returns, for a phase measured on the preloaded ledger, the
// phase --only names to run it: its empty-ledger phase, or the phase that
// one is measured within (closes: closes_credits).
func preloadedBase(phase string) (string, bool) {
	base, ok := strings.CutSuffix(phase, preloadedSuffix)
	if !ok {
		return "", false
	}
	if base == PhaseCloses {
		base = PhaseClosesCredits
	}
	return base, true
}

// runs reports whether phase is part of the run: a phase through PgBouncer
// runs with --pgbouncer, and one on the preloaded ledger with --preload,
// when its empty-ledger phase runs.
func (c *Config) runs(phase string) bool {
	if direct, ok := strings.CutSuffix(phase, pooledSuffix); ok {
		return c.PgBouncer && c.runs(direct)
	}
	if base, ok := preloadedBase(phase); ok {
		return c.Preload > 0 && c.runs(base)
	}
	return len(c.Only) == 0 || slices.Contains(c.Only, phase)
}

// poolerURL returns dbURL through the run's PgBouncer, started at the first
// call in the work directory, in front of the admin URL's server, with a
// pool of 20 server connections per database.
func (r *run) poolerURL(ctx context.Context, dbURL string) (string, error) {
	if r.bouncer == nil {
		b, err := pgbouncer.Start(ctx, pgbouncer.Config{Dir: filepath.Join(r.cfg.WorkDir, "pgbouncer"), Backend: r.cfg.AdminURL})
		if err != nil {
			return "", fmt.Errorf("error starting pgbouncer: %w", err)
		}
		r.bouncer = b
		r.logf("pgbouncer (transaction mode) on 127.0.0.1:%d", b.Port)
	}
	return r.bouncer.URL(dbURL)
}

// runsAny reports whether any of phases is part of the run.
func (c *Config) runsAny(phases ...string) bool {
	return slices.ContainsFunc(phases, c.runs)
}

// run is the state of one benchmark run.
type run struct {
	cfg       Config
	id        string // hex, part of every database name
	binDir    string
	logDir    string
	databases []string           // created, dropped at the end
	baseURL   string             // the baselines' database, once created (baseDatabase)
	bouncer   *pgbouncer.Bouncer // with --pgbouncer, once started (pooler)
	mem       memory
	report    *Report

	// preloadTpl is the preloaded ledger's template database, with
	// --preload, once built (preloadTemplate).
	preloadTpl string
}

// Run performs one benchmark run and returns its report. An error means the
// run could not be carried out (setup failed, ctx canceled); a phase whose
// requests failed is recorded in the report (Report.Failures) and the run
// goes on with the next phase. The work directory, when Run creates it, is
// removed at the end unless Keep, or the run failed: then the servers' logs
// stay there, and the log says where.
func Run(ctx context.Context, cfg Config) (_ *Report, err error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	r := &run{cfg: cfg, id: randomHex(4)}
	r.report = &Report{Short: cfg.Short, Results: map[string]*Result{}}

	if r.cfg.WorkDir == "" {
		dir, err := os.MkdirTemp("", "tally-bench-")
		if err != nil {
			return nil, fmt.Errorf("error creating a work directory: %w", err)
		}
		r.cfg.WorkDir = dir
		defer func() {
			if cfg.Keep || err != nil || len(r.report.Failures) > 0 {
				r.logf("work directory kept: %s (server logs in %s)", dir, r.logDir)
				return
			}
			_ = os.RemoveAll(dir)
		}()
	}
	r.logDir = filepath.Join(r.cfg.WorkDir, "logs")
	if err := os.MkdirAll(r.logDir, 0o755); err != nil {
		return nil, fmt.Errorf("error creating %s: %w", r.logDir, err)
	}
	defer r.dropDatabases()
	defer func() {
		if r.bouncer != nil {
			r.bouncer.Stop()
		}
	}()

	header, err := describe(ctx, cfg)
	if err != nil {
		return nil, err
	}
	r.report.Header = header

	if len(cfg.Only) != 1 || cfg.Only[0] != PhaseRiverNoop { // every other phase runs a server, or pairs with one
		r.logf("building server, stripesim, billingctl and migrate from %s", cfg.serverRepo())
		var err error
		if r.binDir, err = proc.Commands(ctx, cfg.serverRepo()); err != nil {
			return nil, fmt.Errorf("error building the commands: %w", err)
		}
	}
	// The preloaded ledger first, while nothing else runs.
	if cfg.runsAny(PhaseIngestSpreadPreloaded, PhaseIngestBatchPreloaded, PhaseChargesPreloaded, PhaseClosesPreloaded) {
		if _, err := r.preloadTemplate(ctx); err != nil {
			return nil, err
		}
	}
	steps := []struct {
		phases []string
		do     func(context.Context) error
	}{
		{ingestPhases, r.ingest},
		{[]string{PhaseUsageQuery}, r.usageQuery},
		{[]string{PhaseRiverNoop, PhaseCharges}, r.charges},
		{[]string{PhaseClosesCredits}, r.closes},
	}
	for _, s := range steps {
		if !cfg.runsAny(s.phases...) {
			continue
		}
		if err := s.do(ctx); err != nil {
			return nil, err
		}
	}
	r.report.MemoryPeak, r.report.MemoryWho = r.mem.peak(), r.mem.who
	r.report.judge()
	if cfg.Keep {
		r.logf("databases kept: %s", strings.Join(r.databases, ", "))
	}
	return r.report, nil
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Log, "bench %s: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// record stores a phase's result, or its failure, and logs it.
func (r *run) record(res *Result, err error) error {
	if err != nil {
		var pe *phaseError
		if !errors.As(err, &pe) {
			return err // the run itself failed
		}
		r.logf("PHASE %s FAILED: %v", pe.phase, pe.err)
		r.report.Failures = append(r.report.Failures, pe.Error())
		if res == nil {
			return nil
		}
	}
	r.report.Results[res.Phase] = res
	r.logf("%s", res.summary())
	return nil
}

// step is one phase: its name and how to measure it.
type step struct {
	name    string
	measure func() (*Result, error)
}

// phases measures, in order, the steps the run includes, and records each
// result; it stops at an error of the run itself.
func (r *run) phases(steps ...step) error {
	for _, s := range steps {
		if !r.cfg.runs(s.name) {
			continue
		}
		if err := r.checkpoint(context.Background()); err != nil {
			return err
		}
		if err := r.record(s.measure()); err != nil {
			return err
		}
	}
	return nil
}

// checkpoint flushes Postgres's dirty pages before a timed window, as
// pgbench does, so no phase pays for the WAL of the one before it (a
// checkpoint in progress makes every first write to a page log the whole
// page).
func (r *run) checkpoint(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, r.cfg.AdminURL)
	if err != nil {
		return fmt.Errorf("error connecting for a checkpoint: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("error checkpointing: %w", err)
	}
	return nil
}

// phaseError is a phase whose work failed (requests answered non-2xx, a
// charge not succeeded): recorded, and the run goes on.
type phaseError struct {
	phase string
	err   error
}

func (e *phaseError) Error() string { return e.phase + ": " + e.err.Error() }
func (e *phaseError) Unwrap() error { return e.err }

// loopError turns a loop's failed calls into a *phaseError with a sample.
func loopError(phase string, lr loopResult) error {
	if lr.errors == 0 {
		return nil
	}
	return &phaseError{phase: phase, err: fmt.Errorf("%d of %d calls failed; first: %w", lr.errors, lr.errors+lr.ops, lr.firstErr)}
}

// createDatabase creates a fresh database named after the run and suffix,
// migrates it with this bench's own migrations (the baselines copy Tally's
// tables), and returns its URL.
func (r *run) createDatabase(ctx context.Context, suffix string) (string, error) {
	dbURL, err := r.createEmptyDatabase(ctx, suffix)
	if err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return "", fmt.Errorf("error connecting to %s: %w", dbURL, err)
	}
	defer pool.Close()
	if err := schema.Up(ctx, pool, io.Discard); err != nil {
		return "", fmt.Errorf("error migrating %s: %w", dbURL, err)
	}
	return dbURL, nil
}

// createEmptyDatabase creates a fresh database named after the run and
// suffix and returns its URL.
func (r *run) createEmptyDatabase(ctx context.Context, suffix string) (string, error) {
	name := fmt.Sprintf("tally_bench_%s_%s", r.id, suffix)
	r.logf("creating and migrating database %s", name)
	admin, err := pgx.Connect(ctx, r.cfg.AdminURL)
	if err != nil {
		return "", fmt.Errorf("error connecting to the admin database: %w", err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	_ = admin.Close(context.WithoutCancel(ctx))
	if err != nil {
		return "", fmt.Errorf("error creating database %s: %w", name, err)
	}
	r.databases = append(r.databases, name)
	u, _ := url.Parse(r.cfg.AdminURL) // validated
	u.Path = "/" + name
	return u.String(), nil
}

// serverRepo is the checkout the Tally binaries are built from.
func (c *Config) serverRepo() string {
	if c.ServerRepoDir != "" {
		return c.ServerRepoDir
	}
	return c.RepoDir
}

// dropDatabases drops the run's databases unless Keep, even when the run's
// context is done.
func (r *run) dropDatabases() {
	if r.cfg.Keep || len(r.databases) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, r.cfg.AdminURL)
	if err != nil {
		r.logf("error connecting to drop databases %v: %v", r.databases, err)
		return
	}
	defer admin.Close(ctx)
	for _, name := range r.databases {
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			r.logf("error dropping database %s: %v", name, err)
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
