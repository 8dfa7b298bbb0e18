// Command bench is make bench: in one run against one Postgres it measures
// raw baselines (plain SQL, COPY, River with a no-op worker) and then Tally
// through real HTTP against real server processes, prints one table of
// ratios to the baselines, and exits 1 when a target is missed (see
// internal/tools/bench for the phases and targets).
//
//	go run ./tools/bench                      the full run (a few minutes)
//	go run ./tools/bench --short              a few seconds per phase, small counts; nothing asserted
//	go run ./tools/bench --only raw_sql,ingest_spread
//	go run ./tools/bench --write-docs         also rewrite the marked section of docs/benchmarks.md
//	go run ./tools/bench --preload 50000000 --only ingest_spread,ingest_batch,charges,closes_credits
//	                                          those phases also on a ledger of 50 M past events (docs/scaling.md)
//
// The admin URL (a role allowed to CREATE DATABASE) comes from --admin-url or
// TALLY_TEST_ADMIN_DATABASE_URL; make bench sets it from
// scripts/ensure-postgres.sh.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/tally-billing/tally/internal/tools/bench"
	"github.com/tally-billing/tally/internal/tools/proc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// options are the flags that are not part of bench.Config.
type options struct {
	writeDocs bool
}

// parseFlags returns the run's configuration from args: the full run's
// defaults, or with --short the short run's, overridden by the flags given.
func parseFlags(args []string, stderr io.Writer) (bench.Config, options, error) {
	cfg, short := bench.DefaultConfig(), bench.ShortConfig()
	var opts options
	var only string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&cfg.Short, "short", false, fmt.Sprintf(
		"a quick run that asserts nothing: --duration %s, --charges %d, --load-events %d unless given",
		short.Duration, short.Charges, short.LoadEvents))
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long each timed phase posts")
	fs.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients of raw_sql and the single-event ingest phases")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "River MaxWorkers of river_noop and TALLY_WORKERS of every server (the server's default is 50)")
	fs.IntVar(&cfg.Charges, "charges", cfg.Charges, "periods closed at once in charges, and jobs worked by river_noop")
	fs.IntVar(&cfg.LoadEvents, "load-events", cfg.LoadEvents, "events loaded through the batch API before ingest_after_load, and in the period usage_query reads")
	fs.IntVar(&cfg.Customers, "customers", cfg.Customers, "customers the ingest phases spread events over")
	fs.StringVar(&cfg.ServerRepoDir, "server-repo", "", "build the Tally commands from this checkout (git worktree add DIR COMMIT) to measure another commit")
	fs.IntVar(&cfg.Preload, "preload", cfg.Preload, "N: also measure ingest_spread, ingest_batch, charges and closes on a ledger of N events of past closed "+
		"periods (*_preloaded, target ≥ 0.9× the empty ledger), in the same rotations; the ledger is built once in a template "+
		"database and cloned for each server's database, dropped after its phase unless --keep (each clone is the ledger's size)")
	fs.IntVar(&cfg.WorkerReplicas, "worker-replicas", cfg.WorkerReplicas, "worker replicas (server processes) of the charges phase")
	fs.StringVar(&cfg.AdminURL, "admin-url", os.Getenv("TALLY_TEST_ADMIN_DATABASE_URL"), "admin Postgres URL (default $TALLY_TEST_ADMIN_DATABASE_URL)")
	fs.BoolVar(&cfg.PgBouncer, "pgbouncer", false, "also measure ingest_spread, ingest_batch and charges through PgBouncer in transaction mode, beside the direct figures")
	fs.StringVar(&only, "only", "", "comma-separated phases to run ("+strings.Join(bench.Phases, ",")+"); default all")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the run's databases and work directory (binaries, server logs)")
	fs.BoolVar(&opts.writeDocs, "write-docs", false, "rewrite the section between "+bench.DocsBegin+" and "+bench.DocsEnd+" of docs/benchmarks.md")
	if err := fs.Parse(args); err != nil {
		return cfg, opts, err
	}
	if fs.NArg() > 0 {
		return cfg, opts, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if cfg.Short {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		for name, apply := range map[string]func(){
			"duration":    func() { cfg.Duration = short.Duration },
			"charges":     func() { cfg.Charges = short.Charges },
			"load-events": func() { cfg.LoadEvents = short.LoadEvents },
		} {
			if !given[name] {
				apply()
			}
		}
	}
	if only != "" {
		cfg.Only = strings.Split(only, ",")
	}
	if opts.writeDocs && (cfg.Short || len(cfg.Only) > 0) {
		return cfg, opts, errors.New("--write-docs needs a full run: not with --short or --only")
	}
	return cfg, opts, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, opts, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	cfg.Log, cfg.Command = stderr, commandLine(args)
	if cfg.RepoDir, err = proc.ModuleRoot(ctx); err != nil {
		return err
	}

	report, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	report.Write(stdout)
	if len(report.Failures) > 0 {
		return fmt.Errorf("%d phase(s) failed: %s", len(report.Failures), strings.Join(report.Failures, "; "))
	}
	if opts.writeDocs {
		path := filepath.Join(cfg.RepoDir, "docs", "benchmarks.md")
		if err := bench.WriteDocs(path, report); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "bench: wrote %s\n", path)
	}
	if missed := report.Missed(); !cfg.Short && len(missed) > 0 {
		names := make([]string, len(missed))
		for i, t := range missed {
			names[i] = t.Name
		}
		return fmt.Errorf("%d target(s) missed: %s", len(missed), strings.Join(names, ", "))
	}
	return nil
}

// commandLine is the command as a person would type it: go run ./tools/bench
// when run by go run (a binary in a go-build directory), else the binary.
func commandLine(args []string) string {
	name := os.Args[0]
	if strings.Contains(name, "go-build") {
		name = "go run ./tools/bench"
	}
	parts := []string{name}
	for _, a := range args {
		if strings.ContainsAny(a, " \t'\"$") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}
