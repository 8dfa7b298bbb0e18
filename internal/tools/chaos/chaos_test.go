package chaos

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestChaosShort is the short chaos variant inside make test: the real
// binaries, 3 worker and 2 API replicas, faults everywhere, and the checks
// of the promise, on 3,000 events. make chaos runs the long variant.
func TestChaosShort(t *testing.T) {
	t.Parallel()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	// A fixed seed keeps make test reproducible (timing still varies);
	// TALLY_CHAOS_SEED picks another, make chaos a random one.
	cfg := ShortConfig(7)
	if v := os.Getenv("TALLY_CHAOS_SEED"); v != "" {
		cfg = ShortConfig(mustAtoi(t, v))
	}
	cfg.RepoDir = filepath.Dir(strings.TrimSpace(string(gomod)))
	cfg.WorkDir = t.TempDir()
	if d := os.Getenv("TALLY_CHAOS_WORKDIR"); d != "" {
		cfg.WorkDir = d // kept after the test, for reading the replicas' logs
	}
	cfg.Out = testWriter{t}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	report, err := Run(ctx, cfg)
	require.NoError(t, err)
	var sb strings.Builder
	report.Write(&sb)
	t.Log(sb.String())
	if !report.OK() {
		t.Errorf("chaos run found %d violations (seed %d; logs in %s)", len(report.Violations), cfg.Seed, cfg.WorkDir)
	}
	require.Positive(t, report.EventsAcked)
	require.Positive(t, report.Faults["kill worker"])
	require.Positive(t, report.Faults["kill api"])
	require.Positive(t, report.VoidsAcked, "events voided while their period was open")
	// Top-ups were bought through the API and by automatic recharges, and
	// some succeeded (each then checked against Stripe and its grant).
	for _, k := range []string{"bought", "recharges", "succeeded"} {
		require.Positive(t, report.TopUps[k], "top-ups: %s", k)
	}
	// The plan customers' periods were rated, with both versions, and the
	// check saw zero quantities and quantities exactly on a bound.
	for _, k := range []string{"usage " + chaosPlanID + " v1", "usage " + chaosPlanID + " v2", "usage of zero", "usage on a bound", "pre_priced", "carried"} {
		require.Positive(t, report.Lines[k], "charge lines: %s", k)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func mustAtoi(t *testing.T, s string) int64 {
	var n int64
	for _, c := range s {
		require.True(t, c >= '0' && c <= '9', "TALLY_CHAOS_SEED must be a number")
		n = n*10 + int64(c-'0')
	}
	return n
}
