// Package schema applies and checks Tally's database migrations: goose
// migrations for schema billing (embedded from the top-level sql package) and
// River's own migrations for schema river. cmd/migrate, the server's /readyz
// and the test database template all go through it, so there is one way to
// migrate.
//
// Up and Down hold a Postgres session advisory lock for their whole run, so
// two replicas migrating at once serialize: the second finds nothing to do.
package schema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	tallysql "github.com/tally-billing/tally/sql"
)

const (
	// BillingSchema is the Postgres schema of Tally's own tables.
	BillingSchema = "billing"

	// RiverSchema is the Postgres schema of River's tables. Every River client
	// and migrator must be configured with it.
	RiverSchema = "river"

	// gooseTable is goose's version table, kept next to the tables it versions.
	gooseTable = BillingSchema + ".goose_db_version"

	// migrateLockID is the advisory lock key held while migrating
	// (the first 8 bytes of sha256("tally:migrate")).
	migrateLockID int64 = 0x5a1f0c3e7b2d9a41
)

// DownOpts says how far Down goes.
type DownOpts struct {
	// All rolls back every Tally migration and then River's, leaving empty
	// schemas. Without it, Down rolls back only the latest Tally migration.
	All bool
}

// Up applies every pending Tally and River migration and writes one line per
// applied migration to out. It is safe to run any number of times, and from
// several processes at once.
func Up(ctx context.Context, pool *pgxpool.Pool, out io.Writer) error {
	return withLock(ctx, pool, func(db *sql.DB) error {
		for _, s := range []string{BillingSchema, RiverSchema} {
			if _, err := db.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+s); err != nil {
				return fmt.Errorf("error creating schema %s: %w", s, err)
			}
		}
		provider, err := newProvider(db)
		if err != nil {
			return err
		}
		results, err := provider.Up(ctx)
		if err != nil {
			return fmt.Errorf("error applying tally migrations: %w", err)
		}
		for _, r := range results {
			fmt.Fprintf(out, "tally: applied %s (%s)\n", r.Source.Path, r.Duration.Round(1e6))
		}

		res, err := riverMigrator(pool).Migrate(ctx, rivermigrate.DirectionUp, nil)
		if err != nil {
			return fmt.Errorf("error applying river migrations: %w", err)
		}
		for _, v := range res.Versions {
			fmt.Fprintf(out, "river: applied version %03d %s (%s)\n", v.Version, v.Name, v.Duration.Round(1e6))
		}
		if len(results) == 0 && len(res.Versions) == 0 {
			fmt.Fprintln(out, "nothing to apply: tally and river migrations are current")
		}
		return nil
	})
}

// Down rolls back the latest Tally migration, or with opts.All every Tally
// and River migration, and writes one line per rolled-back migration to out.
func Down(ctx context.Context, pool *pgxpool.Pool, out io.Writer, opts DownOpts) error {
	return withLock(ctx, pool, func(db *sql.DB) error {
		versioned, err := hasVersionTable(ctx, pool)
		if err != nil {
			return err
		}
		if !versioned {
			fmt.Fprintln(out, "nothing to roll back: no tally migration was ever applied")
			return nil
		}
		provider, err := newProvider(db)
		if err != nil {
			return err
		}
		if !opts.All {
			r, err := provider.Down(ctx)
			if errors.Is(err, goose.ErrNoNextVersion) {
				fmt.Fprintln(out, "nothing to roll back")
				return nil
			}
			if err != nil {
				return fmt.Errorf("error rolling back tally migration: %w", err)
			}
			fmt.Fprintf(out, "tally: rolled back %s\n", r.Source.Path)
			return nil
		}
		results, err := provider.DownTo(ctx, 0)
		if err != nil {
			return fmt.Errorf("error rolling back tally migrations: %w", err)
		}
		for _, r := range results {
			fmt.Fprintf(out, "tally: rolled back %s\n", r.Source.Path)
		}
		res, err := riverMigrator(pool).Migrate(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: -1})
		if err != nil {
			return fmt.Errorf("error rolling back river migrations: %w", err)
		}
		for _, v := range res.Versions {
			fmt.Fprintf(out, "river: rolled back version %03d %s\n", v.Version, v.Name)
		}
		return nil
	})
}

// Status writes the state of every Tally migration and River's current
// version to out.
func Status(ctx context.Context, pool *pgxpool.Pool, out io.Writer) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := newProvider(db)
	if err != nil {
		return err
	}
	versioned, err := hasVersionTable(ctx, pool)
	if err != nil {
		return err
	}
	var statuses []*goose.MigrationStatus
	if versioned {
		if statuses, err = provider.Status(ctx); err != nil {
			return fmt.Errorf("error reading tally migration status: %w", err)
		}
	} else {
		// Reading goose's status would create its table: list the sources.
		for _, src := range provider.ListSources() {
			statuses = append(statuses, &goose.MigrationStatus{Source: src, State: goose.StatePending})
		}
	}
	for _, s := range statuses {
		when := "pending"
		if s.State == goose.StateApplied {
			when = "applied " + s.AppliedAt.UTC().Format("2006-01-02T15:04:05Z")
		}
		fmt.Fprintf(out, "tally: %-40s %s\n", s.Source.Path, when)
	}
	migrator := riverMigrator(pool)
	existing, err := migrator.ExistingVersions(ctx)
	if err != nil {
		return fmt.Errorf("error reading river migration status: %w", err)
	}
	all := migrator.AllVersions()
	fmt.Fprintf(out, "river: %d of %d versions applied\n", len(existing), len(all))
	return nil
}

// Check returns nil when every Tally and River migration is applied, and an
// error saying what is pending otherwise. The server's /readyz uses it; it
// only reads.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	versioned, err := hasVersionTable(ctx, pool)
	if err != nil {
		return err
	}
	if !versioned {
		return errors.New("tally migrations pending: no migration applied yet; run migrate up")
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := newProvider(db)
	if err != nil {
		return err
	}
	current, target, err := provider.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("error reading tally migration version: %w", err)
	}
	if current != target {
		return fmt.Errorf("tally migrations at version %d, want %d: run migrate up", current, target)
	}
	res, err := riverMigrator(pool).Validate(ctx, nil)
	if err != nil {
		return fmt.Errorf("error validating river migrations: %w", err)
	}
	if !res.OK {
		return fmt.Errorf("river migrations pending: %v", res.Messages)
	}
	return nil
}

// hasVersionTable reports whether goose's version table exists; goose itself
// would create it on first read.
func hasVersionTable(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, gooseTable).Scan(&exists); err != nil {
		return false, fmt.Errorf("error looking for %s: %w", gooseTable, err)
	}
	return exists, nil
}

func newProvider(db *sql.DB) (*goose.Provider, error) {
	fsys, err := fs.Sub(tallysql.Migrations, "migrations")
	if err != nil {
		return nil, fmt.Errorf("error opening embedded migrations: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(gooseTable),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("error loading tally migrations: %w", err)
	}
	return provider, nil
}

func riverMigrator(pool *pgxpool.Pool) *rivermigrate.Migrator[pgx.Tx] {
	// The config is static and valid; New only fails on an invalid one.
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: RiverSchema})
	if err != nil {
		panic(err)
	}
	return m
}

// withLock runs fn while holding the migration advisory lock on a dedicated
// connection; the lock is released (or dropped with the session) afterwards.
func withLock(ctx context.Context, pool *pgxpool.Pool, fn func(db *sql.DB) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("error connecting to acquire migration lock: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLockID); err != nil {
		return fmt.Errorf("error acquiring migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the lock must be released even when ctx is done.
		_, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", migrateLockID)
	}()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return fn(db)
}
