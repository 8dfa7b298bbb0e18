// Command server runs Tally: the HTTP API and/or the River workers, by
// TALLY_ROLES. Configuration comes from the environment; see README.md.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
)

// gcPercentDefault is the server's GOGC when the environment sets none. Go's
// own default (100) collects a batch request's garbage several times per
// request and hands the pages back to the kernel between requests, a large
// share of the server's CPU under batch ingest; 400 collects less often for
// a bounded rise in memory (the figures: docs/benchmarks.md, "Figures behind
// the code's choices"). Set GOGC (and GOMEMLIMIT) to trade otherwise.
const gcPercentDefault = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercentDefault)
	}
	if err := run(context.Background(), os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "tally: %v\n", err)
		os.Exit(1)
	}
}
