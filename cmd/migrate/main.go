// Command migrate applies Tally's migrations (schema billing, goose) and
// River's (schema river):
//
//	migrate up            apply everything pending
//	migrate down          roll back the latest Tally migration
//	migrate down --all    roll back every Tally and River migration
//	migrate status        list migrations and whether they are applied
//
// The database comes from DATABASE_URL. Up and down hold an advisory lock,
// so replicas may run them at once; running up twice does nothing the second
// time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tally-billing/tally/internal/postgres"
	"github.com/tally-billing/tally/internal/schema"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "migrate: %v\n", err)
		os.Exit(1)
	}
}

const usage = `usage: migrate up | down [--all] | status   (database from DATABASE_URL)`

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if len(args) == 0 {
		return errors.New(usage)
	}
	url := getenv("DATABASE_URL")
	if url == "" {
		return errors.New("DATABASE_URL is required, such as postgres://user@127.0.0.1:5432/tally")
	}
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("migrate "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	all := fs.Bool("all", false, "with down: roll back every Tally and River migration")
	if err := fs.Parse(rest); err != nil {
		return err
	}

	pool, err := postgres.Connect(ctx, url, "tally-migrate", 4)
	if err != nil {
		return err
	}
	defer pool.Close()

	switch cmd {
	case "up":
		return schema.Up(ctx, pool, stdout)
	case "down":
		return schema.Down(ctx, pool, stdout, schema.DownOpts{All: *all})
	case "status":
		return schema.Status(ctx, pool, stdout)
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}
