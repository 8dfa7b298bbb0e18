// Command server runs Tally: the HTTP API and/or the River workers, by
// TALLY_ROLES. Configuration comes from the environment; see README.md.
package main

import (
	"context"
	"fmt"
	"os"
)

func main() {
	if err := run(context.Background(), os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "tally: %v\n", err)
		os.Exit(1)
	}
}
