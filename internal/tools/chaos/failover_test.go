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

	"github.com/tally-billing/tally/internal/tools/proc"
)

// TestFailoverShort is the short failover drill inside make test: a primary
// with a streaming standby, replication stalled while periods are charged,
// the primary killed, the standby promoted; then the checks of the promise.
// Async loses acknowledged writes by design and must still never charge a
// (customer, period) twice; Sync must lose nothing. make failover runs the
// long variant.
func TestFailoverShort(t *testing.T) {
	t.Parallel()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	require.NoError(t, err)
	repoDir := filepath.Dir(strings.TrimSpace(string(gomod)))
	// One build for both drills.
	buildCtx, cancelBuild := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancelBuild()
	binDir, err := proc.Commands(buildCtx, repoDir)
	require.NoError(t, err)

	drill := func(t *testing.T, sync bool) {
		// A fixed seed keeps make test reproducible (timing still varies);
		// TALLY_CHAOS_SEED picks another.
		cfg := ShortFailoverConfig(7, sync)
		if v := os.Getenv("TALLY_CHAOS_SEED"); v != "" {
			cfg.Seed = mustAtoi(t, v)
		}
		cfg.BinDir, cfg.RepoDir = binDir, repoDir
		cfg.WorkDir = t.TempDir()
		if d := os.Getenv("TALLY_CHAOS_WORKDIR"); d != "" {
			cfg.WorkDir = filepath.Join(d, "failover-"+map[bool]string{false: "async", true: "sync"}[sync])
			require.NoError(t, os.RemoveAll(cfg.WorkDir))
			require.NoError(t, os.MkdirAll(cfg.WorkDir, 0o755))
		}
		cfg.Out = testWriter{t}

		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		report, err := RunFailover(ctx, cfg)
		require.NoError(t, err)
		var sb strings.Builder
		report.Write(&sb)
		t.Log(sb.String())
		if !report.OK() {
			t.Errorf("failover drill (%s) found %d violations (seed %d; logs in %s)", report.Mode, len(report.Violations), cfg.Seed, cfg.WorkDir)
		}
		require.Positive(t, report.EventsAcked)
		require.Positive(t, report.PaymentIntentsSucceeded)
	}

	t.Run("Async", func(t *testing.T) {
		t.Parallel()
		drill(t, false)
	})

	t.Run("Sync", func(t *testing.T) {
		t.Parallel()
		drill(t, true)
	})
}
