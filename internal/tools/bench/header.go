package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// describe gathers the report's header: the date, the machine, Postgres and
// its durability settings, and the commit measured.
func describe(ctx context.Context, cfg Config) (Header, error) {
	h := Header{Date: time.Now().UTC(), CPUs: runtime.NumCPU(), MemTotal: memTotal(), Command: cfg.Command}
	conn, err := pgx.Connect(ctx, cfg.AdminURL)
	if err != nil {
		return h, fmt.Errorf("error connecting to the admin database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var fsync, syncCommit string
	for _, s := range []struct {
		name string
		into *string
	}{{"server_version", &h.PGVersion}, {"fsync", &fsync}, {"synchronous_commit", &syncCommit}} {
		if err := conn.QueryRow(ctx, "SHOW "+s.name).Scan(s.into); err != nil {
			return h, fmt.Errorf("error reading Postgres setting %s: %w", s.name, err)
		}
	}
	h.PGSettings = fmt.Sprintf("fsync %s, synchronous_commit %s", fsync, syncCommit)
	h.Commit = gitCommit(ctx, cfg.serverRepo())
	return h, nil
}

// memTotal returns MemTotal from /proc/meminfo in bytes, or 0.
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// gitCommit returns HEAD's short hash in repoDir, with -dirty when tracked
// files differ from it, or "unknown".
func gitCommit(ctx context.Context, repoDir string) string {
	out, err := exec.CommandContext(ctx, "git", "-C", repoDir, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	status, err := exec.CommandContext(ctx, "git", "-C", repoDir, "status", "--porcelain", "--untracked-files=no").Output()
	if err != nil || len(strings.TrimSpace(string(status))) > 0 {
		commit += "-dirty"
	}
	return commit
}
