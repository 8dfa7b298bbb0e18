// Package testdb gives each test its own migrated Postgres database, cloned
// from a template that is migrated once per migration set. Tests run against
// a real Postgres, never a mock of it. A test binary run through Main puts
// each database back as the template left it for the next test, rather
// than creating and dropping one per test (reuse.go).
//
// The admin connection comes from TALLY_TEST_ADMIN_DATABASE_URL (make test
// sets it from scripts/ensure-postgres.sh), else the local Postgres at
// 127.0.0.1:5432. The role must be allowed to CREATE DATABASE.
package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/tally-billing/tally/internal/postgres"
	"github.com/tally-billing/tally/internal/schema"
	tallysql "github.com/tally-billing/tally/sql"
)

// AdminURLDefault is the admin connection used when
// TALLY_TEST_ADMIN_DATABASE_URL is unset.
const AdminURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// templateLockID serializes template creation across test binaries, which
// `go test ./...` runs in parallel.
const templateLockID int64 = 0x7a11e57da7ab0001

var (
	templateOnce sync.Once
	templateName string
	templateErr  error
)

// AdminURL returns the admin connection string used for creating databases.
func AdminURL() string {
	if u := os.Getenv("TALLY_TEST_ADMIN_DATABASE_URL"); u != "" {
		return u
	}
	return AdminURLDefault
}

// New gives t a fully migrated database, as the template left it, put back
// or dropped when t ends, and returns a pool connected to it together with
// its connection string.
func New(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()

	templateOnce.Do(func() { templateName, templateErr = ensureTemplate(ctx) })
	if templateErr != nil {
		t.Fatalf("error preparing template database: %v", templateErr)
	}

	url := cloneTemplate(t)
	pool, err := postgres.Connect(ctx, url, "tally-test", 0)
	if err != nil {
		t.Fatalf("error connecting to test database: %v", err)
	}
	t.Cleanup(pool.Close) // runs before the drop registered by createDatabase
	return pool, url
}

// cloneTemplate returns the URL of a database as the template left it, put
// back when t ends (reuse.go): one an earlier test put back, else a new
// clone.
func cloneTemplate(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	db, ok := spareDB{}, false
	if reuseOn.Load() {
		db, ok = takeSpare()
	}
	if !ok {
		db.name = "tally_t_" + randomHex(8)
		admin := adminConn(t)
		_, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", db.name, templateName))
		_ = admin.Close(ctx)
		if err != nil {
			t.Fatalf("error creating test database: %v", err)
		}
	}
	url, err := databaseURL(db.name)
	if err != nil {
		t.Fatal(err)
	}
	if !ok && reuseOn.Load() {
		// A fresh clone: its catalog is the template's.
		if db.catalog, err = notePristine(ctx, url); err != nil {
			t.Logf("testdb: databases not reused: %v", err)
		}
	}
	t.Cleanup(func() { release(t, db) })
	return url
}

// NewEmpty creates a database with nothing in it (no schema, no migration),
// dropped when t ends, and returns its connection string: for testing
// migrations and readiness on a fresh database.
func NewEmpty(t testing.TB) string {
	t.Helper()
	return createDatabase(t, "tally_e_"+randomHex(8), "")
}

// createDatabase creates database name (from template, when given), drops it
// when t ends, and returns its URL.
func createDatabase(t testing.TB, name, template string) string {
	t.Helper()
	ctx := context.Background()
	stmt := "CREATE DATABASE " + name
	if template != "" {
		stmt += " TEMPLATE " + template
	}
	admin := adminConn(t)
	if _, err := admin.Exec(ctx, stmt); err != nil {
		t.Fatalf("error creating test database: %v", err)
	}
	_ = admin.Close(ctx)
	t.Cleanup(func() {
		admin := adminConn(t)
		defer admin.Close(context.Background())
		if _, err := admin.Exec(context.Background(), fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
			t.Logf("error dropping test database %s: %v", name, err)
		}
	})
	url, err := databaseURL(name)
	if err != nil {
		t.Fatal(err)
	}
	return url
}

func adminConn(t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), AdminURL())
	if err != nil {
		t.Fatalf("error connecting to admin database (set TALLY_TEST_ADMIN_DATABASE_URL or run make test): %v", err)
	}
	return conn
}

// ensureTemplate creates, once per migration set, a migrated template database
// whose name carries a hash of the migrations, so a changed migration gets a
// new template.
func ensureTemplate(ctx context.Context) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "tally_tpl_" + sum[:16]

	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return "", fmt.Errorf("error connecting to admin database (set TALLY_TEST_ADMIN_DATABASE_URL or run make test): %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockID); err != nil {
		return "", err
	}
	defer func() { _, _ = admin.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", templateLockID) }()

	var ready bool
	err = admin.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", name).Scan(&ready)
	if err == nil && ready {
		return name, nil
	}
	// A half-built template from a crashed run is rebuilt.
	if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", name)); err != nil {
		return "", err
	}
	url, err := databaseURL(name)
	if err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return "", err
	}
	err = schema.Up(ctx, pool, io.Discard)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("error migrating template database: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s IS_TEMPLATE true", name)); err != nil {
		return "", err
	}
	return name, nil
}

func migrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(tallysql.Migrations, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := tallysql.Migrations.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%s\x00", path, b)
		return nil
	})
	if err != nil {
		return "", err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(nil), &rivermigrate.Config{Schema: schema.RiverSchema})
	if err != nil {
		return "", err
	}
	for _, v := range migrator.AllVersions() {
		fmt.Fprintf(h, "river\x00%d\x00%s\x00%s\x00", v.Version, v.Name, v.SQLUp)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func databaseURL(name string) (string, error) {
	u, err := url.Parse(AdminURL())
	if err != nil || u.Scheme == "" {
		return "", fmt.Errorf("admin URL must be a postgres:// URL: %q", AdminURL())
	}
	u.Path = "/" + name
	return u.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Dump writes a pg_dump (custom format) of the database at url into a file
// under t's temporary directory and returns its path: a backup, as an
// operator takes one, for restore drills.
func Dump(t testing.TB, url string) string {
	t.Helper()
	path := t.TempDir() + "/backup.dump"
	runPGTool(t, "pg_dump", "--format=custom", "--file="+path, "--dbname="+url)
	return path
}

// Restore restores a Dump into a new database, dropped when t ends, and
// returns a pool connected to it with its connection string: the database
// as an operator's restore would leave it.
func Restore(t testing.TB, dumpPath string) (*pgxpool.Pool, string) {
	t.Helper()
	url := createDatabase(t, "tally_r_"+randomHex(8), "")
	runPGTool(t, "pg_restore", "--exit-on-error", "--no-owner", "--dbname="+url, dumpPath)
	pool, err := postgres.Connect(context.Background(), url, "tally-test", 0)
	if err != nil {
		t.Fatalf("error connecting to restored database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, url
}

// runPGTool runs a Postgres client tool (pg_dump, pg_restore) from PATH or
// the newest server installation, failing t with its output on error.
func runPGTool(t testing.TB, tool string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath(tool)
	if err != nil {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + tool)
		if len(dirs) == 0 {
			t.Fatalf("%s not found on PATH nor under /usr/lib/postgresql (scripts/ensure-postgres.sh installs it)", tool)
		}
		slices.Sort(dirs)
		bin = dirs[len(dirs)-1]
	}
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", tool, err, out)
	}
}
