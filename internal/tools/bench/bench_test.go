package bench

import (
	"context"
	"strings"
	"testing"
	"time"

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
