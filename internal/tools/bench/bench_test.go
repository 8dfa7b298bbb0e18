package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/tools/proc"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// TestBenchShort runs every phase of the benchmark, short-sized, against the
// test Postgres and the real binaries, and checks that each phase measured
// something and the table came out. It never compares a figure with a
// target: durations on a shared machine prove nothing in a test.
func TestBenchShort(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	repoDir, err := proc.ModuleRoot(ctx)
	require.NoError(t, err)
	cfg := ShortConfig()
	cfg.AdminURL, cfg.RepoDir = testdb.AdminURL(), repoDir
	cfg.WorkDir = t.TempDir()
	cfg.Duration = 1500 * time.Millisecond
	cfg.Charges, cfg.LoadEvents, cfg.Customers = 50, 5000, 200
	cfg.Command = "go test ./internal/tools/bench/ -run TestBenchShort"
	cfg.Log = testWriter{t}

	report, err := Run(ctx, cfg)
	require.NoError(t, err)
	var out strings.Builder
	report.Write(&out)
	t.Log("\n" + out.String())

	require.Empty(t, report.Failures)
	for _, phase := range Phases {
		if !cfg.runs(phase) {
			require.Nil(t, report.Results[phase], "phase %s ran without --pgbouncer", phase)
			continue
		}
		res := report.Results[phase]
		require.NotNil(t, res, "phase %s has no result", phase)
		require.Positive(t, res.Count, "phase %s", phase)
		require.Positive(t, res.Rate(), "phase %s", phase)
	}
	for _, phase := range []string{PhaseRawSQL, PhaseIngestSpread, PhaseIngestHot, PhaseIngestAfterLoad, PhaseUsageQuery} {
		require.NotNil(t, report.Results[phase].Latency, "phase %s has no latencies", phase)
	}
	require.Positive(t, report.MemoryPeak)
	judged := 3 // ingest_spread p99, usage_query p99, RSS
	for _, rt := range ratioTargets {
		if !rt.optional {
			judged++
		}
	}
	require.Len(t, report.Targets, judged, "the targets through PgBouncer are shown only with --pgbouncer")
	for _, target := range report.Targets {
		require.NotEqual(t, StatusNotMeasured, target.Status, "target %s", target.Name)
	}
	require.True(t, report.OK(), "a short run asserts no target")
	require.Contains(t, out.String(), "| phase | Tally | baseline | ratio | target | met |")
	require.Contains(t, out.String(), "| charges |")
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	sorted := make([]time.Duration, 1000)
	for i := range sorted {
		sorted[i] = time.Duration(i+1) * time.Millisecond
	}
	l := newLatency(sorted)
	require.Equal(t, 500*time.Millisecond, l.P50)
	require.Equal(t, 990*time.Millisecond, l.P99)
	require.Equal(t, 999*time.Millisecond, l.P999)
	require.Equal(t, 1000*time.Millisecond, l.Max)
	require.Equal(t, time.Second, percentile([]time.Duration{time.Second}, 0.999))
	require.Nil(t, newLatency(nil))
}

func TestReplaceSection(t *testing.T) {
	t.Parallel()
	rep := &Report{Short: true, Results: map[string]*Result{
		PhaseRawSQL: {Phase: PhaseRawSQL, Unit: "events/s", Count: 1000, Elapsed: time.Second},
	}}
	rep.judge()

	doc := "# Benchmarks\n\nIntro.\n\n## Old section\n\nkept\n"
	added, err := replaceSection(doc, rep)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(added, "# Benchmarks\n\nIntro.\n\n## make bench\n"), added)
	require.Contains(t, added, DocsBegin+"\nmake bench · ")
	require.True(t, strings.HasSuffix(added, DocsEnd+"\n\n## Old section\n\nkept\n"), added)

	rep.Results[PhaseRawSQL].Count = 2000
	rep.judge()
	replaced, err := replaceSection(added, rep)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(replaced, DocsBegin))
	require.Contains(t, replaced, "raw_sql 2,000 events/s")
	require.NotContains(t, replaced, "raw_sql 1,000 events/s")
	require.True(t, strings.HasSuffix(replaced, "## Old section\n\nkept\n"))

	_, err = replaceSection("x "+DocsEnd+" y "+DocsBegin, rep)
	require.Error(t, err)
}

func TestFormatCount(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4500: "-4,500"} {
		require.Equal(t, want, formatCount(n))
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// A phase through PgBouncer runs with --pgbouncer when its direct phase
// does, and --only cannot name it alone.
func TestPooledPhases(t *testing.T) {
	t.Parallel()
	c := Config{Only: []string{PhaseIngestSpread, PhaseCharges}}
	require.False(t, c.runs(PhaseIngestSpreadPooled))
	c.PgBouncer = true
	require.True(t, c.runs(PhaseIngestSpreadPooled))
	require.True(t, c.runs(PhaseChargesPooled))
	require.False(t, c.runs(PhaseIngestBatchPooled), "ingest_batch does not run")
	c = DefaultConfig()
	c.AdminURL, c.RepoDir, c.Only = "postgres://x@127.0.0.1/postgres", "/repo", []string{PhaseChargesPooled}
	require.ErrorContains(t, c.validate(), `unknown phase "charges_pgbouncer": name charges and add --pgbouncer`)
}

// A phase on the preloaded ledger runs with --preload when its empty-ledger
// phase does (closes_preloaded with closes_credits, which closes is
// measured within), and --only cannot name it alone.
func TestPreloadedPhases(t *testing.T) {
	t.Parallel()
	c := Config{Only: []string{PhaseIngestSpread, PhaseClosesCredits}}
	for _, phase := range []string{PhaseIngestSpreadPreloaded, PhaseClosesPreloaded, PhaseChargesPreloaded} {
		require.False(t, c.runs(phase), "%s without --preload", phase)
	}
	c.Preload = 1000
	require.True(t, c.runs(PhaseIngestSpreadPreloaded))
	require.True(t, c.runs(PhaseClosesPreloaded), "closes is measured within closes_credits")
	require.False(t, c.runs(PhaseIngestBatchPreloaded), "ingest_batch does not run")
	require.False(t, c.runs(PhaseChargesPreloaded), "charges does not run")
	require.False(t, c.runs(PhaseIngestSpreadPooled), "--preload runs no PgBouncer variant")
	c.PgBouncer = true
	require.True(t, c.runs(PhaseIngestSpreadPooled), "--pgbouncer and --preload together run both")
	require.True(t, c.runs(PhaseIngestSpreadPreloaded))

	c = DefaultConfig()
	c.AdminURL, c.RepoDir = "postgres://x@127.0.0.1/postgres", "/repo"
	c.Preload = 200_000
	require.True(t, c.runs(PhaseChargesPreloaded), "every variant runs in a full run")
	require.NoError(t, c.validate())
	c.Only = []string{PhaseChargesPreloaded, PhaseClosesPreloaded}
	err := c.validate()
	require.ErrorContains(t, err, `unknown phase "charges_preloaded": name charges and add --preload N`)
	require.ErrorContains(t, err, `unknown phase "closes_preloaded": name closes_credits and add --preload N`)
	c.Only, c.Preload = nil, -1
	require.ErrorContains(t, c.validate(), "preload -1: must not be negative")
}

// The targets on the preloaded ledger are ≥ 0.9× the empty ledger's phase,
// on the median of the rounds, and rows only when measured.
func TestPreloadedTargets(t *testing.T) {
	t.Parallel()
	res := func(phase string, count int64) *Result {
		return &Result{Phase: phase, Unit: "events/s", Count: count, Elapsed: time.Second}
	}
	rep := &Report{Short: true, Results: map[string]*Result{
		PhaseIngestSpread: res(PhaseIngestSpread, 1000), PhaseIngestSpreadPreloaded: res(PhaseIngestSpreadPreloaded, 920),
		PhaseCloses: res(PhaseCloses, 600), PhaseClosesPreloaded: res(PhaseClosesPreloaded, 500),
		PhaseIngestBatch: res(PhaseIngestBatch, 40_000),
	}, Pairs: map[string][]float64{
		pairKey(PhaseIngestSpreadPreloaded, PhaseIngestSpread): {0.95, 0.85, 0.91},
		pairKey(PhaseClosesPreloaded, PhaseCloses):             {0.8, 0.95, 0.85},
	}}
	rep.judge()
	byName := map[string]Target{}
	for _, target := range rep.Targets {
		byName[target.Name] = target
	}
	spread := byName[PhaseIngestSpreadPreloaded]
	require.Equal(t, StatusMet, spread.Status, "median 0.91 of the rounds, not the 0.92 of the totals")
	require.Equal(t, "0.91 (0.85–0.95, 3 pairs)", spread.Ratio)
	require.Equal(t, "≥ 0.9× ingest_spread", spread.Want)
	require.Equal(t, StatusMissed, byName[PhaseClosesPreloaded].Status, "median 0.85")
	for _, phase := range []string{PhaseIngestBatchPreloaded, PhaseChargesPreloaded} {
		require.NotContains(t, byName, phase, "not measured: no row")
	}

	rep.Results[PhaseIngestSpreadPreloaded] = nil
	delete(rep.Pairs, pairKey(PhaseIngestSpreadPreloaded, PhaseIngestSpread))
	rep.judge()
	for _, target := range rep.Targets {
		require.NotEqual(t, PhaseIngestSpreadPreloaded, target.Name)
	}
}

// preloadEventsOf counts what the preload SQL writes: event g to customer
// g % customers, in month g / customers % 12.
func TestPreloadEventsOf(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 11, 12, 13, 100, 1000, 119_999, 120_000, 200_000, 250_001} {
		customers := preloadCustomersOf(n)
		want := map[[2]int]int64{}
		for g := range n {
			want[[2]int{g % customers, g / customers % preloadMonths}]++
		}
		for _, i := range []int{0, 1, customers - 1, customers} {
			for month := range preloadMonths {
				require.Equal(t, want[[2]int{i, month}], preloadEventsOf(n, customers, i, month),
					"n %d, %d customers, customer %d, month %d", n, customers, i, month)
			}
		}
	}
	require.Equal(t, 10_000, preloadCustomersOf(50_000_000))
	require.Equal(t, 1, preloadCustomersOf(5))
	require.Equal(t, int64(417), preloadEventsOf(50_000_000, 10_000, 0, 0))
}

func TestLedgerSizesAddIndexes(t *testing.T) {
	t.Parallel()
	var plain ledgerSizes
	plain.addIndexes([]indexSize{
		{"billing.usage_events_pkey", "billing.usage_events_pkey", 100},
		{"billing.usage_events_customer_id_event_id_key", "billing.usage_events_customer_id_event_id_key", 300},
	})
	require.Equal(t, ledgerSizes{IndexBytes: 400, Indexes: 2,
		Largest: "billing.usage_events_customer_id_event_id_key", LargestBytes: 300,
		LargestLeaf: "billing.usage_events_customer_id_event_id_key", LargestLeafSize: 300}, plain)

	var parted ledgerSizes
	parted.addIndexes([]indexSize{
		{"billing.usage_events_pkey", "billing.usage_events_p00_pkey", 50},
		{"billing.usage_events_pkey", "billing.usage_events_p01_pkey", 70},
		{"billing.usage_events_period_idx", "billing.usage_events_p00_period_idx", 90},
		{"billing.usage_events_period_idx", "billing.usage_events_p01_period_idx", 20},
		{"billing.usage_events_p01_extra", "billing.usage_events_p01_extra", 100}, // a partition's own index
	})
	require.Equal(t, int64(330), parted.IndexBytes)
	require.Equal(t, 3, parted.Indexes)
	require.Equal(t, "billing.usage_events_pkey", parted.Largest, "summed over its partitions: 120")
	require.Equal(t, int64(120), parted.LargestBytes)
	require.Equal(t, "billing.usage_events_p01_extra", parted.LargestLeaf)
	require.Equal(t, int64(100), parted.LargestLeafSize)

	require.Equal(t, partition{"b", 30, 1}, hottest([]partition{{"a", 10, 9}, {"b", 30, 1}, {"c", 30, 2}}))
}

func TestFormatBytes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 bytes", 1023: "1023 bytes", 1024: "1.0 kB", 8192: "8.0 kB",
		1536 * 1024: "1.5 MB", 250 << 20: "250 MB", 13 << 30: "13.0 GB"} {
		require.Equal(t, want, formatBytes(n))
	}
}

// The report's ledger lines: the VACUUM and the usage query only when
// measured.
func TestLedgerFiguresWrite(t *testing.T) {
	t.Parallel()
	fig := &LedgerFigures{Events: 200_000, Customers: 10_000, Preload: 4 * time.Second, Rollup: 3 * time.Second,
		VacuumAnalyze: time.Second, Clones: 2, CloneTotal: 3 * time.Second,
		Sizes: ledgerSizes{Partitions: 1, Rows: 200_000, HeapBytes: 30 << 20, IndexBytes: 20 << 20, Indexes: 3,
			Largest: "billing.usage_events_customer_id_event_id_key", LargestBytes: 10 << 20}}
	rep := &Report{Short: true, Results: map[string]*Result{}, Ledger: fig}
	rep.judge()
	var out strings.Builder
	rep.Write(&out)
	s := out.String()
	require.Contains(t, s, "Ledger (--preload 200,000: 10,000 customers × 12 closed months of 2025")
	require.Contains(t, s, "- template: preload 4s (50,000 events/s), roll-up 3s, VACUUM (ANALYZE) 1s; 2 clone(s), 1.5s each on average")
	require.Contains(t, s, "≈ 200,000 rows in 1 partition(s); 30.0 MB heap + 20.0 MB in 3 index(es) = 50.0 MB; "+
		"largest index billing.usage_events_customer_id_event_id_key 10.0 MB\n")
	require.NotContains(t, s, "VACUUM of the hottest")
	require.NotContains(t, s, "usage query")

	fig.VacuumPartition, fig.VacuumRows, fig.VacuumTime = "billing.usage_events", 210_000, 1500*time.Millisecond
	lat := func(p50 time.Duration) *Latency { return &Latency{N: usageCalls, P50: p50, P99: 2 * p50} }
	fig.UsagePreloaded = &usageFigure{Customer: "pre-0", Period: "2025-01", Events: 2, Latency: lat(2 * time.Millisecond)}
	fig.UsageEmpty = &usageFigure{Customer: "cust-0000", Events: 150, Latency: lat(time.Millisecond)}
	fig.Sizes.Partitions, fig.Sizes.LargestLeaf, fig.Sizes.LargestLeafSize = 16, "billing.usage_events_p03_customer_id_event_id_key", 1<<20
	out.Reset()
	rep.Write(&out)
	s = out.String()
	require.Contains(t, s, "over its partitions (the largest of one partition: billing.usage_events_p03_customer_id_event_id_key 1.0 MB)")
	require.Contains(t, s, "- VACUUM of the hottest partition, billing.usage_events (≈ 210,000 rows), on the ingest phases' clone after them: 1500 ms")
	require.Contains(t, s, "pre-0's 2025-01 (2 events) on the preloaded ledger p50 2.00 ms, p99 4.00 ms; "+
		"cust-0000's current period (150 events) on the empty ledger p50 1.00 ms, p99 2.00 ms (p50 ratio 2.00)")
}

// The ledger's sizes and its hottest partition are read from pg_inherits:
// a plain usage_events is its own single partition; a hash-partitioned one
// sums its partitions, each index over them.
func TestUsageEventsSizes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		ddl        []string
		partitions int
	}{
		{"plain", []string{
			`CREATE TABLE billing.usage_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			 customer_id text NOT NULL, event_id text NOT NULL, amount_cents bigint, UNIQUE (customer_id, event_id))`,
		}, 1},
		{"partitioned", []string{
			`CREATE TABLE billing.usage_events (id bigint GENERATED ALWAYS AS IDENTITY, customer_id text NOT NULL,
			 event_id text NOT NULL, amount_cents bigint, PRIMARY KEY (id, customer_id), UNIQUE (customer_id, event_id))
			 PARTITION BY HASH (customer_id)`,
			`CREATE TABLE billing.usage_events_p00 PARTITION OF billing.usage_events FOR VALUES WITH (MODULUS 4, REMAINDER 0)`,
			`CREATE TABLE billing.usage_events_p01 PARTITION OF billing.usage_events FOR VALUES WITH (MODULUS 4, REMAINDER 1)`,
			`CREATE TABLE billing.usage_events_p02 PARTITION OF billing.usage_events FOR VALUES WITH (MODULUS 4, REMAINDER 2)`,
			`CREATE TABLE billing.usage_events_p03 PARTITION OF billing.usage_events FOR VALUES WITH (MODULUS 4, REMAINDER 3)`,
		}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := testdb.NewEmpty(t)
			conn, err := pgx.Connect(ctx, dbURL)
			require.NoError(t, err)
			defer conn.Close(ctx)
			stmts := append([]string{`CREATE SCHEMA billing`}, tc.ddl...)
			stmts = append(stmts,
				`CREATE INDEX usage_events_amount_idx ON billing.usage_events (customer_id) INCLUDE (amount_cents)`,
				// Most rows to one customer: its partition is the hottest.
				`INSERT INTO billing.usage_events (customer_id, event_id, amount_cents)
				 SELECT CASE WHEN g % 4 = 0 THEN 'c' || (g % 97) ELSE 'hot' END, 'e' || g, g FROM generate_series(1, 20000) g`,
				`VACUUM (ANALYZE)`)
			for _, stmt := range stmts {
				_, err := conn.Exec(ctx, stmt)
				require.NoError(t, err, stmt)
			}
			sizes, err := usageEventsSizes(ctx, conn)
			require.NoError(t, err)
			t.Logf("%s: %s", tc.name, sizes.summary())
			require.Equal(t, tc.partitions, sizes.Partitions)
			require.Equal(t, int64(20000), sizes.Rows)
			require.Equal(t, 3, sizes.Indexes, "primary key, unique, amount: each counted once")
			require.Positive(t, sizes.HeapBytes)
			require.Positive(t, sizes.LargestLeafSize)
			require.GreaterOrEqual(t, sizes.LargestBytes, sizes.LargestLeafSize)
			require.True(t, strings.HasPrefix(sizes.Largest, "billing.usage_events_"), sizes.Largest)
			require.NotContains(t, sizes.Largest, "_p0", "a partitioned index, summed over its partitions")

			parts, err := usageEventsPartitions(ctx, conn)
			require.NoError(t, err)
			require.Len(t, parts, tc.partitions)
			var hotPart string
			require.NoError(t, conn.QueryRow(ctx, `SELECT tableoid::regclass::text FROM billing.usage_events WHERE customer_id = 'hot' LIMIT 1`).Scan(&hotPart))
			require.Equal(t, hotPart, hottest(parts).name)
			require.GreaterOrEqual(t, hottest(parts).rows, int64(15000))
		})
	}
}
