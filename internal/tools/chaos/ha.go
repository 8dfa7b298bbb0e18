package chaos

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// database is the Postgres a run writes to: a private cluster (startCluster),
// or with Config.HA a pg_auto_failover formation (startFormation).
type database interface {
	adminURL() string
	url(db string) string
	// restart is the run's Postgres fault: the cluster restarted, or the
	// formation's primary killed; it calls down when the database stops
	// taking writes and returns once it takes them again (the formation: a
	// primary and its secondary back).
	restart(ctx context.Context, down func()) error
	stop()
}

// formation is the pg_auto_failover formation of scripts/ha.sh (make ha-up):
// a monitor, a primary and a secondary on loopback, synchronous while the
// secondary is healthy. Every process of the run reaches it through the
// multi-host URL with target_session_attrs=read-write, so a failover needs
// nothing of them.
type formation struct {
	repoDir string
	tally   string // the multi-host URL of database tally
}

// startFormation destroys any formation left in .tmp/ha and brings up a
// fresh one, synchronous unless async (a minute at most on this machine).
func startFormation(ctx context.Context, repoDir string, async bool) (*formation, error) {
	f := &formation{repoDir: repoDir}
	if _, err := f.script(ctx, "destroy"); err != nil {
		return nil, err
	}
	up := []string{"up"}
	if async {
		up = append(up, "--async")
	}
	if _, err := f.script(ctx, up...); err != nil {
		return nil, err
	}
	out, err := f.script(ctx, "url")
	if err != nil {
		return nil, err
	}
	f.tally = strings.TrimSpace(out)
	if !strings.Contains(f.tally, "/tally?") {
		return nil, fmt.Errorf("scripts/ha.sh url printed %q", f.tally)
	}
	return f, nil
}

// script runs scripts/ha.sh with args and returns its standard output.
func (f *formation) script(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(f.repoDir, "scripts", "ha.sh")}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/ha.sh %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

func (f *formation) adminURL() string { return f.url("postgres") }

func (f *formation) url(db string) string { return strings.Replace(f.tally, "/tally?", "/"+db+"?", 1) }

// restart kills the primary's node (SIGKILL to its keeper and postmaster),
// waits until the monitor has promoted the secondary, then starts the dead
// node's keeper again and waits until it has rejoined as the secondary.
func (f *formation) restart(ctx context.Context, down func()) error {
	out, err := f.script(ctx, "kill-primary")
	if err != nil {
		return err
	}
	down()
	if _, err := f.script(ctx, "wait-failover", strings.TrimSpace(out), "300"); err != nil {
		return err
	}
	if _, err := f.script(ctx, "start"); err != nil {
		return err
	}
	_, err = f.script(ctx, "wait", "300")
	return err
}

// switchover is a planned failover (pg_autoctl perform switchover), then the
// wait for the secondary.
func (f *formation) switchover(ctx context.Context) error {
	if _, err := f.script(ctx, "switchover"); err != nil {
		return err
	}
	_, err := f.script(ctx, "wait", "180")
	return err
}

// stop stops the formation; its data stays in .tmp/ha for a look.
func (f *formation) stop() {
	_, _ = f.script(context.Background(), "down")
}
