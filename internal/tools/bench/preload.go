package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// With --preload N, the preloaded ledger (GitHub issue 27) is built once
// per run, in a template database: migrated by the built migrate command,
// N events of past, closed periods written with set-based SQL, rolled up
// as a ledger in service would be (else the first worker on a clone would
// roll N events up inside a measured phase), VACUUM (ANALYZE) and
// CHECKPOINT. Every database a *_preloaded phase needs is a clone of it
// (CREATE DATABASE … TEMPLATE), dropped once its phase is done, so a run
// holds the template and one clone at a time however large N is. The
// empty-ledger phases keep their fresh, empty databases: both sides of a
// pair run in the same rotation, as the phases through PgBouncer do.

// preloadCustomers and preloadMonths shape the preloaded history: events of
// 2025's twelve monthly periods, all closed, of customers of their own
// (pre-0 …).
const (
	preloadCustomers = 10_000
	preloadMonths    = 12
)

// preloadTemplateSuffix ends the template database's name:
// tally_bench_<hex>_preload_tpl.
const preloadTemplateSuffix = "preload_tpl"

// usageCalls is how many GET /v1/customers/{id}/usage calls, one client,
// each side of the ledger's usage comparison makes.
const usageCalls = 200

// preloadCustomersOf is how many customers n preloaded events spread over.
func preloadCustomersOf(n int) int {
	return min(preloadCustomers, max(1, n/preloadMonths))
}

// preloadEventsOf is how many events of customer pre-i in month (0 is
// 2025-01) the preload SQL writes, n events over customers customers: event
// g goes to customer g % customers, month g / customers % 12.
func preloadEventsOf(n, customers, i, month int) int64 {
	if i >= customers || i >= n {
		return 0
	}
	k := (n - i + customers - 1) / customers // the events of customer i: g = j·customers + i, j < k
	if k <= month {
		return 0
	}
	return int64((k-month-1)/preloadMonths + 1)
}

// LedgerFigures is what a run with --preload measured of the preloaded
// ledger (Report.Ledger).
type LedgerFigures struct {
	Events    int // preloaded
	Customers int // pre-0 … they spread over, 12 closed months each

	// Building the template, once per run.
	Preload       time.Duration // the set-based INSERTs
	Rollup        time.Duration // rolling the events up (set-based, as migration 00026 did)
	VacuumAnalyze time.Duration // VACUUM (ANALYZE) of the whole database
	Clones        int           // databases cloned from the template
	CloneTotal    time.Duration // CREATE DATABASE … TEMPLATE, all of them

	// billing.usage_events on the template, summed over its partitions.
	Sizes ledgerSizes

	// VACUUM of the partition with the most rows, on the clone the ingest
	// phases wrote to, after them; VacuumTime 0: not measured.
	VacuumPartition string
	VacuumRows      int64 // estimated (pg_class), not counted
	VacuumTime      time.Duration

	// GET /v1/customers/{id}/usage, usageCalls calls each, one client: a
	// preloaded customer's month on the preloaded clone, and a customer's
	// current period on the empty ingest database. Nil: not measured.
	UsagePreloaded, UsageEmpty *usageFigure
}

// usageFigure is one side of the usage comparison.
type usageFigure struct {
	Customer, Period string // Period "": the current one
	Events           int64  // as the answer counts them
	Latency          *Latency
}

// ledgerSizes are the sizes of billing.usage_events: a plain table is its
// own single partition; a partitioned one's partitions are read from
// pg_inherits, and each of its indexes is summed over the partitions.
type ledgerSizes struct {
	Partitions int
	Rows       int64 // estimated (pg_class.reltuples, just analyzed)
	HeapBytes  int64 // pg_table_size of each partition: heap, TOAST, free space and visibility maps
	IndexBytes int64 // every index of every partition
	Indexes    int   // the table's indexes (a partitioned index counts once)
	// Largest is the largest index, its partitions' sizes summed;
	// LargestLeaf the largest index of one partition (when partitioned).
	Largest, LargestLeaf          string
	LargestBytes, LargestLeafSize int64
}

// indexSize is one index of one partition of usage_events: root is the
// index of usage_events it is a partition of (itself when the table is
// not partitioned).
type indexSize struct {
	root, leaf string
	bytes      int64
}

// addIndexes sums indexes into s: the total, each root's over its
// partitions, the largest root and the largest partition's index.
func (s *ledgerSizes) addIndexes(indexes []indexSize) {
	byRoot := map[string]int64{}
	var roots []string
	for _, ix := range indexes {
		if _, ok := byRoot[ix.root]; !ok {
			roots = append(roots, ix.root)
		}
		byRoot[ix.root] += ix.bytes
		s.IndexBytes += ix.bytes
		if ix.bytes > s.LargestLeafSize || (ix.bytes == s.LargestLeafSize && ix.leaf < s.LargestLeaf) {
			s.LargestLeaf, s.LargestLeafSize = ix.leaf, ix.bytes
		}
	}
	s.Indexes = len(roots)
	for _, root := range roots {
		if b := byRoot[root]; b > s.LargestBytes || (b == s.LargestBytes && root < s.Largest) {
			s.Largest, s.LargestBytes = root, b
		}
	}
}

// partitionsSQL lists the tables holding usage_events' rows — its leaf
// partitions, found through pg_inherits, or the table itself when it is
// not partitioned — with their estimated rows (reltuples scaled to the
// pages they have now, as the planner does: no scan) and sizes.
const partitionsSQL = `
WITH RECURSIVE tree AS (
    SELECT 'billing.usage_events'::regclass::oid AS relid
    UNION ALL
    SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.relid
)
SELECT c.oid::regclass::text,
       CASE WHEN c.relpages > 0
            THEN c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int)
            ELSE greatest(c.reltuples, 0) END::bigint,
       pg_table_size(c.oid)
FROM tree t JOIN pg_class c ON c.oid = t.relid
WHERE c.relkind = 'r'
ORDER BY 1`

// indexesSQL lists the indexes of usage_events' leaf partitions, each with
// the index of usage_events it is a partition of (pg_inherits upwards),
// and its size.
const indexesSQL = `
WITH RECURSIVE tree AS (
    SELECT 'billing.usage_events'::regclass::oid AS relid
    UNION ALL
    SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.relid
), up AS (
    SELECT x.indexrelid AS leaf, x.indexrelid AS rel
    FROM tree t JOIN pg_class c ON c.oid = t.relid AND c.relkind = 'r'
    JOIN pg_index x ON x.indrelid = t.relid
    UNION ALL
    SELECT u.leaf, i.inhparent FROM up u JOIN pg_inherits i ON i.inhrelid = u.rel
)
SELECT u.rel::regclass::text, u.leaf::regclass::text, pg_relation_size(u.leaf)
FROM up u
WHERE NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = u.rel)
ORDER BY 2`

// partition is one table holding usage_events' rows.
type partition struct {
	name  string
	rows  int64 // estimated
	bytes int64
}

// usageEventsPartitions reads the partitions of usage_events (partitionsSQL).
func usageEventsPartitions(ctx context.Context, conn *pgx.Conn) ([]partition, error) {
	rows, err := conn.Query(ctx, partitionsSQL)
	if err != nil {
		return nil, fmt.Errorf("error reading the partitions of billing.usage_events: %w", err)
	}
	parts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (partition, error) {
		var p partition
		return p, row.Scan(&p.name, &p.rows, &p.bytes)
	})
	if err != nil {
		return nil, fmt.Errorf("error reading the partitions of billing.usage_events: %w", err)
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("billing.usage_events has no partition holding rows")
	}
	return parts, nil
}

// usageEventsSizes measures usage_events' sizes (ledgerSizes).
func usageEventsSizes(ctx context.Context, conn *pgx.Conn) (ledgerSizes, error) {
	var s ledgerSizes
	parts, err := usageEventsPartitions(ctx, conn)
	if err != nil {
		return s, err
	}
	for _, p := range parts {
		s.Partitions++
		s.Rows += p.rows
		s.HeapBytes += p.bytes
	}
	rows, err := conn.Query(ctx, indexesSQL)
	if err != nil {
		return s, fmt.Errorf("error reading the indexes of billing.usage_events: %w", err)
	}
	indexes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (indexSize, error) {
		var ix indexSize
		return ix, row.Scan(&ix.root, &ix.leaf, &ix.bytes)
	})
	if err != nil {
		return s, fmt.Errorf("error reading the indexes of billing.usage_events: %w", err)
	}
	s.addIndexes(indexes)
	return s, nil
}

// hottest returns the partition with the most rows (the first by name of
// equals).
func hottest(parts []partition) partition {
	h := parts[0]
	for _, p := range parts[1:] {
		if p.rows > h.rows {
			h = p
		}
	}
	return h
}

// preloadTemplate returns the name of the run's preloaded template
// database, building it at the first call: migrated, preloaded, rolled up,
// vacuumed and analyzed, checkpointed, its sizes measured into
// Report.Ledger.
func (r *run) preloadTemplate(ctx context.Context) (string, error) {
	if r.preloadTpl != "" {
		return r.preloadTpl, nil
	}
	n := r.cfg.Preload
	fig := &LedgerFigures{Events: n, Customers: preloadCustomersOf(n)}
	dbURL, err := r.migratedDatabase(ctx, preloadTemplateSuffix)
	if err != nil {
		return "", err
	}
	r.logf("preloading %d events of %d customers' 2025 periods into %s", n, fig.Customers, databaseName(dbURL))
	t0 := time.Now()
	if err := preloadEvents(ctx, dbURL, n, fig.Customers); err != nil {
		return "", err
	}
	fig.Preload = time.Since(t0)
	r.logf("preloaded %d events in %s (%s events/s)", n, fig.Preload.Round(time.Second), formatRate(float64(n)/fig.Preload.Seconds()))

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", fmt.Errorf("error connecting to the preloaded template: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t0 = time.Now()
	if err := rollUpAll(ctx, conn); err != nil {
		return "", err
	}
	fig.Rollup = time.Since(t0)
	r.logf("rolled the preloaded events up in %s", fig.Rollup.Round(time.Millisecond))
	t0 = time.Now()
	if _, err := conn.Exec(ctx, "VACUUM (ANALYZE)"); err != nil {
		return "", fmt.Errorf("error vacuuming the preloaded template: %w", err)
	}
	fig.VacuumAnalyze = time.Since(t0)
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return "", fmt.Errorf("error checkpointing the preloaded template: %w", err)
	}
	if fig.Sizes, err = usageEventsSizes(ctx, conn); err != nil {
		return "", err
	}
	_ = conn.Close(ctx)
	r.logf("VACUUM (ANALYZE) of the preloaded template in %s; billing.usage_events: %s", fig.VacuumAnalyze.Round(time.Second),
		fig.Sizes.summary())
	r.report.Ledger = fig
	r.preloadTpl = databaseName(dbURL)
	return r.preloadTpl, nil
}

// preloadEvents writes n events of past, closed periods into dbURL with
// set-based SQL: customers pre-0 … pre-(customers-1), their periods
// 2025-01 to 2025-12, closed, and event g to customer g % customers in
// month g / customers % 12.
func preloadEvents(ctx context.Context, dbURL string, n, customers int) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("error connecting to preload: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []struct {
		sql  string
		args []any
	}{{`
INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at)
SELECT 'pre-' || i, 'cus_pre' || i, 'usd', now(), now() FROM generate_series(0, $1 - 1) i`, []any{customers}}, {`
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, status, closed_at, created_at)
SELECT 'pre-' || i, to_char(m, 'YYYY-MM'), 'usd', m, m + interval '1 month', m + interval '1 month 1 hour',
       'closed', m + interval '1 month 1 hour', now()
FROM generate_series(0, $1 - 1) i, generate_series(timestamptz '2025-01-01 00:00Z', timestamptz '2025-12-01 00:00Z', interval '1 month') m`, []any{customers}}, {`
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, occurred_at, received_at, payload_hash)
SELECT 'pre-' || (g % $1), 'pre-' || g, to_char(m, 'YYYY-MM'), 1 + g % 1000, 'usd', m, m, sha256(int8send(g))
FROM generate_series(0, $2 - 1) g,
     LATERAL (SELECT timestamptz '2025-01-01 00:00Z' + make_interval(months => (g / $1 % 12)::int) AS m) p`,
		[]any{customers, n}},
	} {
		if _, err := conn.Exec(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("error preloading %d events: %w", n, err)
		}
	}
	return nil
}

// rollUpAll adds every event to the usage roll-ups and moves the watermark
// past them, in one transaction, as migration 00026 rolled up the ledger
// it found: on a worker, the usage_rollup job adds 100,000 ids a
// transaction, and the preload's ids interleave every customer-month, so
// each would upsert some 100,000 roll-ups (17 s for 200,000 events on the
// 2-core machine).
func rollUpAll(ctx context.Context, conn *pgx.Conn) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
INSERT INTO billing.usage_rollups (customer_id, period, metric, bucket_start, events, quantity, amount_cents)
SELECT e.customer_id, e.period, CASE WHEN e.amount_cents IS NULL THEN e.metric ELSE '' END,
       date_trunc('hour', e.occurred_at, 'UTC'), count(*), coalesce(sum(e.quantity) FILTER (WHERE e.amount_cents IS NULL), 0),
       coalesce(sum(e.amount_cents), 0)
FROM billing.usage_events e
GROUP BY 1, 2, 3, 4`); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `
UPDATE billing.usage_rollup_watermark
SET event_id = (SELECT coalesce(max(id), 0) FROM billing.usage_events), rolled_at = now(),
    pending_event_id = NULL, pending_void_id = NULL, pending_xid = NULL`)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("%d watermark rows", tag.RowsAffected())
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("error rolling up the preloaded events: %w", err)
	}
	return nil
}

// rollUp starts a worker replica (api,worker, so that /readyz answers;
// Stripe is never called: no charge is due) on dbURL and waits, within
// bound, until it rolled up every event, then stops it.
func (r *run) rollUp(ctx context.Context, dbURL, name string, bound time.Duration) error {
	w, err := r.startServer(ctx, name, dbURL, "TALLY_ROLES=api,worker",
		"STRIPE_API_KEY=sk_test_bench", "STRIPE_API_BASE=http://127.0.0.1:9")
	if err != nil {
		return err
	}
	defer w.stop()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := rollupCaughtUp(ctx, conn, bound); err != nil {
		return fmt.Errorf("error rolling up the events of %s: %w", databaseName(dbURL), err)
	}
	return nil
}

// clonePreloaded creates a database named after the run and suffix as a
// clone of the preloaded template (built at the first call) and returns
// its URL. The template must have no connection: none is left open to it.
func (r *run) clonePreloaded(ctx context.Context, suffix string) (string, error) {
	tpl, err := r.preloadTemplate(ctx)
	if err != nil {
		return "", err
	}
	name := fmt.Sprintf("tally_bench_%s_%s", r.id, suffix)
	admin, err := pgx.Connect(ctx, r.cfg.AdminURL)
	if err != nil {
		return "", fmt.Errorf("error connecting to the admin database: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if err := waitUnused(ctx, admin, tpl, 30*time.Second); err != nil {
		return "", err
	}
	// FILE_COPY (Postgres 15's default is WAL_LOG): a large template's
	// files are copied, not written through the WAL block by block.
	var version int
	if err := admin.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return "", fmt.Errorf("error reading the server's version: %w", err)
	}
	stmt := "CREATE DATABASE " + name + " TEMPLATE " + tpl
	if version >= 150000 {
		stmt += " STRATEGY FILE_COPY"
	}
	t0 := time.Now()
	if _, err := admin.Exec(ctx, stmt); err != nil {
		return "", fmt.Errorf("error creating database %s from %s: %w", name, tpl, err)
	}
	took := time.Since(t0)
	r.databases = append(r.databases, name)
	if fig := r.report.Ledger; fig != nil {
		fig.Clones++
		fig.CloneTotal += took
	}
	r.logf("cloned %s from the preloaded template in %s", name, took.Round(time.Millisecond))
	u, _ := url.Parse(r.cfg.AdminURL) // validated
	u.Path = "/" + name
	return u.String(), nil
}

// waitUnused waits, within bound, until no session but this one is
// connected to database name.
func waitUnused(ctx context.Context, admin *pgx.Conn, name string, bound time.Duration) error {
	for deadline := time.Now().Add(bound); ; time.Sleep(100 * time.Millisecond) {
		var sessions []string
		err := admin.QueryRow(ctx, `
SELECT coalesce(array_agg(pid || ' ' || coalesce(nullif(application_name, ''), '?')), '{}')
FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name).Scan(&sessions)
		if err != nil {
			return fmt.Errorf("error reading the sessions of %s: %w", name, err)
		}
		if len(sessions) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("database %s still has %d session(s) after %s (%s): it cannot be a template",
				name, len(sessions), bound, strings.Join(sessions, ", "))
		}
	}
}

// releaseDatabase drops a database of the run before the run ends (a
// clone of the preloaded template, once its phase is done: they are as
// large as the ledger), unless Keep. Its servers must have stopped.
func (r *run) releaseDatabase(dbURL string) {
	name := databaseName(dbURL)
	if r.cfg.Keep || name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, r.cfg.AdminURL)
	if err != nil {
		r.logf("error connecting to drop database %s: %v", name, err)
		return
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		r.logf("error dropping database %s: %v", name, err)
		return
	}
	for i, db := range r.databases {
		if db == name {
			r.databases = append(r.databases[:i], r.databases[i+1:]...)
			break
		}
	}
}

// databaseName is the database a postgres:// URL names.
func databaseName(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}

// preloadedNote is the note of a phase measured on the preloaded ledger.
func (r *run) preloadedNote() string {
	return fmt.Sprintf("on a clone of the preloaded ledger (%s events of past, closed periods)", formatCount(int64(r.cfg.Preload)))
}

// ledgerAfterIngest measures, once the ingest phases are done, VACUUM of
// the hottest partition on the preloaded clone they wrote to (preURL), and
// the usage query through the servers on either ledger, once a worker
// rolled up the events of the empty one (emptyURL: the usage API reads the
// roll-ups; the preloaded customers' were rolled up in the template).
func (r *run) ledgerAfterIngest(ctx context.Context, preURL, emptyURL string, preloaded, empty *apiClient, customer string) error {
	if err := r.checkpoint(ctx); err != nil {
		return err
	}
	if err := r.vacuumHottest(ctx, preURL); err != nil {
		return err
	}
	if err := r.rollUp(ctx, emptyURL, "worker-ingest-rollup", usageRollupMax); err != nil {
		return err
	}
	return r.compareUsage(ctx, preloaded, empty, customer)
}

// vacuumHottest times VACUUM of the partition of usage_events with the most
// rows on dbURL, into Report.Ledger.
func (r *run) vacuumHottest(ctx context.Context, dbURL string) error {
	fig := r.report.Ledger
	if fig == nil {
		return nil
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("error connecting to vacuum: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	parts, err := usageEventsPartitions(ctx, conn)
	if err != nil {
		return err
	}
	hot := hottest(parts)
	t0 := time.Now()
	if _, err := conn.Exec(ctx, "VACUUM "+hot.name); err != nil {
		return fmt.Errorf("error vacuuming %s: %w", hot.name, err)
	}
	fig.VacuumPartition, fig.VacuumRows, fig.VacuumTime = hot.name, hot.rows, time.Since(t0)
	r.logf("VACUUM %s (≈ %s rows, the most of %d partition(s)) after the ingest phases: %s", hot.name,
		formatCount(hot.rows), len(parts), fig.VacuumTime.Round(time.Millisecond))
	return nil
}

// usageEvents is the part of GET /v1/customers/{id}/usage the comparison
// checks: how many events it counts.
type usageEvents struct {
	Period  string `json:"period"`
	Metrics []struct {
		EventCount int64 `json:"event_count"`
	} `json:"metrics"`
	PrePriced struct {
		EventCount int64 `json:"event_count"`
	} `json:"pre_priced"`
}

func (u usageEvents) events() int64 {
	n := u.PrePriced.EventCount
	for _, m := range u.Metrics {
		n += m.EventCount
	}
	return n
}

// usageLatency asks GET /v1/customers/{customer}/usage (of period, "": the
// current one) once to check it, then usageCalls times back to back from
// one client, and returns the figure; want > 0 is the event count the
// answer must hold.
func usageLatency(ctx context.Context, api *apiClient, customer, period string, want int64) (*usageFigure, error) {
	path := "/v1/customers/" + customer + "/usage"
	if period != "" {
		path += "?period=" + url.QueryEscape(period)
	}
	var u usageEvents
	if err := api.getJSON(ctx, path, &u); err != nil {
		return nil, err
	}
	if want > 0 && u.events() != want {
		return nil, fmt.Errorf("GET %s counts %d events; want %d", path, u.events(), want)
	}
	lr := eachOnce(ctx, 1, usageCalls, setupTimeout, func(ctx context.Context, _, _ int) (int, error) {
		return 1, api.do(ctx, http.MethodGet, path, nil)
	})
	if lr.errors > 0 {
		return nil, fmt.Errorf("GET %s: %d of %d calls failed; first: %w", path, lr.errors, usageCalls, lr.firstErr)
	}
	return &usageFigure{Customer: customer, Period: period, Events: u.events(), Latency: newLatency(lr.latencies)}, nil
}

// compareUsage measures the usage query of a preloaded customer (pre-0's
// 2025-01, rolled up in the template) through preloaded, and of customer
// on the empty ledger's server through empty, into Report.Ledger.
func (r *run) compareUsage(ctx context.Context, preloaded, empty *apiClient, customer string) error {
	fig := r.report.Ledger
	if fig == nil {
		return nil
	}
	const month = 0 // 2025-01
	pre, err := usageLatency(ctx, preloaded, "pre-0", "2025-"+fmt.Sprintf("%02d", month+1),
		preloadEventsOf(fig.Events, fig.Customers, 0, month))
	if err != nil {
		return &phaseError{phase: PhaseIngestSpreadPreloaded, err: fmt.Errorf("usage query on the preloaded ledger: %w", err)}
	}
	emp, err := usageLatency(ctx, empty, customer, "", 0)
	if err != nil {
		return &phaseError{phase: PhaseIngestSpread, err: fmt.Errorf("usage query on the empty ledger: %w", err)}
	}
	fig.UsagePreloaded, fig.UsageEmpty = pre, emp
	r.logf("usage query, %d calls each: %s", usageCalls, fig.usageLine())
	return nil
}

// summary is the sizes as a line.
func (s ledgerSizes) summary() string {
	b := fmt.Sprintf("≈ %s rows in %d partition(s); %s heap + %s in %d index(es) = %s; largest index %s %s",
		formatCount(s.Rows), s.Partitions, formatBytes(s.HeapBytes), formatBytes(s.IndexBytes), s.Indexes,
		formatBytes(s.HeapBytes+s.IndexBytes), s.Largest, formatBytes(s.LargestBytes))
	if s.Partitions > 1 {
		b += fmt.Sprintf(" over its partitions (the largest of one partition: %s %s)", s.LargestLeaf, formatBytes(s.LargestLeafSize))
	}
	return b
}

// usageLine is the usage comparison as a line.
func (f *LedgerFigures) usageLine() string {
	side := func(u *usageFigure, ledger string) string {
		period := "current period"
		if u.Period != "" {
			period = u.Period
		}
		return fmt.Sprintf("%s's %s (%s events) on the %s ledger p50 %s, p99 %s", u.Customer, period,
			formatCount(u.Events), ledger, ms(u.Latency.P50), ms(u.Latency.P99))
	}
	line := side(f.UsagePreloaded, "preloaded") + "; " + side(f.UsageEmpty, "empty")
	if f.UsageEmpty.Latency.P50 > 0 {
		line += fmt.Sprintf(" (p50 ratio %.2f)", float64(f.UsagePreloaded.Latency.P50)/float64(f.UsageEmpty.Latency.P50))
	}
	return line
}

// write writes the figures as the report's "Ledger" lines.
func (f *LedgerFigures) write(w io.Writer) {
	line := func(format string, args ...any) { fmt.Fprintf(w, "- "+format+"\n", args...) }
	fmt.Fprintf(w, "Ledger (--preload %s: %s customers × %d closed months of 2025, built once in a template, "+
		"each *_preloaded phase's database a clone of it):\n\n", formatCount(int64(f.Events)), formatCount(int64(f.Customers)), preloadMonths)
	build := fmt.Sprintf("preload %s (%s events/s), roll-up %s, VACUUM (ANALYZE) %s", round(f.Preload),
		formatRate(float64(f.Events)/max(f.Preload.Seconds(), 1e-9)), round(f.Rollup), round(f.VacuumAnalyze))
	if f.Clones > 0 {
		build += fmt.Sprintf("; %d clone(s), %s each on average", f.Clones, round(f.CloneTotal/time.Duration(f.Clones)))
	}
	line("template: %s", build)
	line("billing.usage_events after the preload: %s", f.Sizes.summary())
	if f.VacuumTime > 0 {
		line("VACUUM of the hottest partition, %s (≈ %s rows), on the ingest phases' clone after them: %s",
			f.VacuumPartition, formatCount(f.VacuumRows), ms(f.VacuumTime))
	}
	if f.UsagePreloaded != nil && f.UsageEmpty != nil {
		line("usage query (GET /v1/customers/{id}/usage, 1 client, %d calls each): %s", usageCalls, f.usageLine())
	}
}

// round rounds d for a report: to the millisecond under 10 s, else to the second.
func round(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// formatBytes formats n bytes in binary units: "812 kB", "1.4 GB" (KiB,
// GiB: Postgres's pg_size_pretty units).
func formatBytes(n int64) string {
	units := []string{"bytes", "kB", "MB", "GB", "TB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	switch {
	case i == 0:
		return strconv.FormatInt(n, 10) + " bytes"
	case v >= 100:
		return fmt.Sprintf("%.0f %s", v, units[i])
	default:
		return fmt.Sprintf("%.1f %s", v, units[i])
	}
}
