// Command chaos runs Tally's fault-injection suite (internal/tools/chaos): the
// real binaries as 3 worker and 2 API replicas, a private Postgres cluster,
// the Stripe simulator, concurrent load and faults everywhere, then an
// independent check of the promise. It prints a report and exits 1 on any
// violation.
//
//	go run ./tools/chaos                 the long variant (make chaos)
//	go run ./tools/chaos --short         the variant inside make test
//	go run ./tools/chaos --seed 42       reproduce a run's schedule of faults
//
// With --failover it runs the failover drill instead (chaos.RunFailover): a
// primary with a streaming standby, replication stalled while periods are
// charged, the primary killed and the standby promoted, then an independent
// check that no (customer, period) was charged twice. It exits 1 on any
// violation.
//
//	go run ./tools/chaos --failover         asynchronous replication (lossy), long variant (make failover)
//	go run ./tools/chaos --failover --sync  synchronous replication: nothing acknowledged may be lost
//	go run ./tools/chaos --failover --short --stall 6s
//
// With --ha the fault-injection run (sync) or the failover drill (async
// unless --sync) runs against the pg_auto_failover formation of
// scripts/ha.sh, whose monitor promotes the secondary (make ha runs both).
//
//	go run ./tools/chaos --ha               the primary's node killed twice and a switchover under load
//	go run ./tools/chaos --failover --ha    the asynchronous formation: replication stalled, the primary's node killed
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tally-billing/tally/internal/tools/chaos"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.Int64("seed", time.Now().UnixNano()%1_000_000, "seed of the load and the fault schedule")
	short := fs.Bool("short", false, "the short variant (3,000 events)")
	events := fs.Int("events", 0, "override the number of distinct events")
	customers := fs.Int("customers", 0, "override the number of customers")
	workDir := fs.String("workdir", "", "where binaries, the Postgres cluster and logs go (default .tmp/chaos/<seed>, "+
		"or .tmp/chaos/failover-<async|sync>-<seed> with --failover)")
	ha := fs.Bool("ha", false, "run against a pg_auto_failover formation (scripts/ha.sh): the primary killed twice and a switchover; "+
		"with --failover, the drill on the formation")
	pooler := fs.Bool("pgbouncer", false, "run the replicas' API and worker pools through PgBouncer in transaction mode")
	failover := fs.Bool("failover", false, "run the failover drill (primary killed after a replication stall, standby promoted) instead")
	sync := fs.Bool("sync", false, "with --failover: synchronous replication, so no acknowledged write may be lost")
	stall := fs.Duration("stall", 0, "with --failover: override how long replication is stalled before the primary dies")
	reclose := fs.Duration("reclose-after", -1, "with --failover: override how long after the failover the lost closes are issued again")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if (*sync || *stall != 0 || *reclose >= 0) && !*failover {
		return errors.New("--sync, --stall and --reclose-after need --failover")
	}
	if *pooler && *failover {
		return errors.New("--pgbouncer runs the fault-injection run, not the failover drill")
	}
	if *pooler && *ha {
		return errors.New("--pgbouncer and --ha together: the pooler here takes one backend host, the formation has three")
	}
	if *failover {
		return runFailover(ctx, *seed, *short, *sync, *ha, *stall, *reclose, *customers, *workDir, stdout, stderr)
	}
	cfg := chaos.LongConfig(*seed)
	if *short {
		cfg = chaos.ShortConfig(*seed)
	}
	if *events > 0 {
		cfg.Events = *events
	}
	if *customers > 0 {
		cfg.Customers = *customers
	}
	cfg.PgBouncer, cfg.HA = *pooler, *ha
	if *ha && !*short {
		// A failover takes about 50 s and a rejoin half a minute or more:
		// spread over six minutes, the load outlasts all three faults.
		cfg.LoadFor = 6 * time.Minute
	}
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" {
		return errors.New("run from inside the Tally repository (go env GOMOD found none)")
	}
	cfg.RepoDir = filepath.Dir(strings.TrimSpace(string(gomod)))
	cfg.WorkDir = *workDir
	if cfg.WorkDir == "" {
		cfg.WorkDir = filepath.Join(cfg.RepoDir, ".tmp", "chaos", fmt.Sprint(*seed))
	}
	if err := os.RemoveAll(cfg.WorkDir); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return err
	}
	cfg.Out = stderr

	ctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	report, err := chaos.Run(ctx, cfg)
	if err != nil {
		return err
	}
	report.Write(stdout)
	fmt.Fprintf(stderr, "logs: %s\n", filepath.Join(cfg.WorkDir, "logs"))
	if !report.OK() {
		return fmt.Errorf("%d violations (seed %d)", len(report.Violations), *seed)
	}
	return nil
}

// runFailover runs the failover drill (short or long variant, on the
// formation with ha; stall and reclose override the variant's when
// positive, resp. not negative) and prints its report; it returns an error
// on any violation.
func runFailover(ctx context.Context, seed int64, short, sync, ha bool, stall, reclose time.Duration, customers int, workDir string, stdout, stderr io.Writer) error {
	cfg := chaos.LongFailoverConfig(seed, sync)
	if short {
		cfg = chaos.ShortFailoverConfig(seed, sync)
	}
	cfg.HA = ha
	if stall > 0 {
		cfg.Stall = stall
	}
	if reclose >= 0 {
		cfg.ReCloseAfter = reclose
	}
	if customers > 0 {
		cfg.Customers = customers
	}
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" {
		return errors.New("run from inside the Tally repository (go env GOMOD found none)")
	}
	cfg.RepoDir = filepath.Dir(strings.TrimSpace(string(gomod)))
	mode := "async"
	if sync {
		mode = "sync"
	}
	if ha {
		mode = "ha-" + mode
	}
	cfg.WorkDir = workDir
	if cfg.WorkDir == "" {
		cfg.WorkDir = filepath.Join(cfg.RepoDir, ".tmp", "chaos", fmt.Sprintf("failover-%s-%d", mode, seed))
	}
	if err := os.RemoveAll(cfg.WorkDir); err != nil {
		return fmt.Errorf("error clearing %s: %w", cfg.WorkDir, err)
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return fmt.Errorf("error creating %s: %w", cfg.WorkDir, err)
	}
	cfg.Out = stderr

	ctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	report, err := chaos.RunFailover(ctx, cfg)
	if err != nil {
		return err
	}
	report.Write(stdout)
	fmt.Fprintf(stderr, "logs: %s\n", filepath.Join(cfg.WorkDir, "logs"))
	if !report.OK() {
		return fmt.Errorf("failover drill (%s): %d violations (seed %d)", mode, len(report.Violations), seed)
	}
	return nil
}
