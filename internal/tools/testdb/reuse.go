package testdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Reuse. A database cloned from the template costs Postgres about 0.2 s of
// CPU to create, and dropping it forces an immediate checkpoint, which
// writes every dirty buffer of every other test's database: together most
// of the CPU a test binary spent, on a machine of two cores. So a test
// binary that runs through Main keeps its databases: when a test ends, its
// database is put back as the template left it (the tables it wrote
// truncated, the template's rows and sequence values restored, the
// activity statistics reset) and the next test takes it. One that cannot
// be put back exactly (its schema or planner statistics changed, the test
// failed, a session still holds it, an error) is dropped, as every
// database was before. Main drops the spare ones at the end.
//
// A database is renamed when put back, which Postgres refuses while any
// session is connected to it: a process a test leaked cannot reconnect to
// the next test's database under its old name.

var (
	reuseOn atomic.Bool // set by Main

	spareMu sync.Mutex
	spare   []spareDB // databases put back, ready for New

	pristineOnce sync.Once
	pristine     *dbState // a fresh clone's state, what a reset restores
	pristineErr  error
)

// spareDB is a database put back, with its catalog's fingerprint then (a
// TRUNCATE gives a table new files, so it changes pg_class).
type spareDB struct {
	name    string
	catalog string
}

// Main runs a test binary's tests and then drops the databases New kept
// for reuse; call it from TestMain:
//
//	func TestMain(m *testing.M) { testdb.Main(m) }
//
// Without it, New drops each test's database when the test ends.
func Main(m *testing.M) {
	reuseOn.Store(true)
	code := m.Run()
	spareMu.Lock()
	var names []string
	for _, db := range spare {
		names = append(names, db.name)
	}
	spare = nil
	spareMu.Unlock()
	if err := dropAll(context.Background(), names); err != nil {
		fmt.Fprintf(os.Stderr, "testdb: %v\n", err)
	}
	os.Exit(code)
}

// takeSpare returns a database put back by an earlier test, if any.
func takeSpare() (spareDB, bool) {
	spareMu.Lock()
	defer spareMu.Unlock()
	if len(spare) == 0 {
		return spareDB{}, false
	}
	db := spare[len(spare)-1]
	spare = spare[:len(spare)-1]
	return db, true
}

// release puts the database of a test that ended back for the next one, or
// drops it when it cannot be put back exactly.
func release(t testing.TB, db spareDB) {
	ctx := context.Background()
	if reuseOn.Load() && !t.Failed() && db.catalog != "" {
		put, err := putBack(ctx, db)
		if err == nil {
			spareMu.Lock()
			spare = append(spare, put)
			spareMu.Unlock()
			return
		}
		if !errors.Is(err, errChanged) {
			t.Logf("testdb: %s not reused: %v", db.name, err)
		}
	}
	if err := dropAll(ctx, []string{db.name}); err != nil {
		t.Logf("error dropping test database %s: %v", db.name, err)
	}
}

func dropAll(ctx context.Context, names []string) error {
	if len(names) == 0 {
		return nil
	}
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	for _, name := range names {
		if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name)); err != nil {
			return fmt.Errorf("error dropping test database %s: %w", name, err)
		}
	}
	return nil
}

// errChanged: the test changed what a reset does not put back (the schema,
// the planner's statistics); the database is dropped.
var errChanged = errors.New("schema or statistics changed")

// putBack resets db to the template's state and renames it.
func putBack(ctx context.Context, db spareDB) (spareDB, error) {
	url, err := databaseURL(db.name)
	if err != nil {
		return spareDB{}, err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return spareDB{}, err
	}
	catalog, err := reset(ctx, conn, db.catalog)
	_ = conn.Close(ctx)
	if err != nil {
		return spareDB{}, err
	}
	put := spareDB{name: "tally_t_" + randomHex(8), catalog: catalog}
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return spareDB{}, err
	}
	defer admin.Close(ctx)
	// Waits up to 5 s for closing sessions to go; fails if one stays.
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", db.name, put.name)); err != nil {
		return spareDB{}, err
	}
	return put, nil
}

// dbState is a fresh clone's state, which a reset restores: its catalog's
// fingerprint, its tables and their rows where the template has any, and
// its sequences.
type dbState struct {
	catalog  string
	empty    []string          // the tables without rows
	rows     map[string]string // table → its rows as JSON, where the template has rows
	rowsHash map[string]string // table → md5 of its rows
	// The sequences, as setval's arguments that put each back.
	sequenceNames  []string
	sequenceValues []int64
	sequenceCalled []bool
}

// catalogQuery fingerprints the schema and the planner's statistics: a row
// created or changed in these catalogs gets a new xmin, and VACUUM and
// ANALYZE change pg_class's sizes in place.
const catalogQuery = `
SELECT string_agg(c, ',' ORDER BY c) FROM (
  SELECT 'class:' || count(*) || ':' || sum(xmin::text::bigint) || ':' || sum(relpages) || ':' || sum(reltuples) AS c FROM pg_class
  UNION ALL SELECT 'attribute:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_attribute
  UNION ALL SELECT 'proc:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_proc
  UNION ALL SELECT 'trigger:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_trigger
  UNION ALL SELECT 'constraint:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_constraint
  UNION ALL SELECT 'index:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_index
  UNION ALL SELECT 'namespace:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_namespace
  UNION ALL SELECT 'type:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_type
  UNION ALL SELECT 'attrdef:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_attrdef
  UNION ALL SELECT 'rewrite:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_rewrite
  UNION ALL SELECT 'policy:' || count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM pg_policy
  UNION ALL SELECT 'sequence:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_sequence
  UNION ALL SELECT 'statistic:' || count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM pg_statistic
  UNION ALL SELECT 'extension:' || count(*) || ':' || sum(xmin::text::bigint) FROM pg_extension
  UNION ALL SELECT 'default_acl:' || count(*) || ':' || coalesce(sum(xmin::text::bigint), 0) FROM pg_default_acl
) s`

// readState reads the state of conn's database, a fresh clone.
func readState(ctx context.Context, conn *pgx.Conn) (*dbState, error) {
	s := &dbState{rows: map[string]string{}, rowsHash: map[string]string{}}
	if err := conn.QueryRow(ctx, catalogQuery).Scan(&s.catalog); err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `
SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_%'
ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, table := range tables {
		var rowsJSON, hash *string
		err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT json_agg(t ORDER BY t::text)::text, md5(string_agg(t::text, ',' ORDER BY t::text)) FROM %s t`, table)).Scan(&rowsJSON, &hash)
		if err != nil {
			return nil, err
		}
		if rowsJSON == nil {
			s.empty = append(s.empty, table)
		} else {
			s.rows[table], s.rowsHash[table] = *rowsJSON, *hash
		}
	}
	rows, err = conn.Query(ctx, `
SELECT format('%I.%I', schemaname, sequencename), coalesce(last_value, start_value), last_value IS NOT NULL
FROM pg_sequences ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name string
		var value int64
		var called bool
		if err := rows.Scan(&name, &value, &called); err != nil {
			return nil, err
		}
		s.sequenceNames = append(s.sequenceNames, name)
		s.sequenceValues = append(s.sequenceValues, value)
		s.sequenceCalled = append(s.sequenceCalled, called)
	}
	return s, rows.Err()
}

// notePristine records the state of a fresh clone, once per test binary,
// and returns its catalog's fingerprint.
func notePristine(ctx context.Context, url string) (string, error) {
	pristineOnce.Do(func() {
		var conn *pgx.Conn
		conn, pristineErr = pgx.Connect(ctx, url)
		if pristineErr != nil {
			return
		}
		defer conn.Close(ctx)
		pristine, pristineErr = readState(ctx, conn)
	})
	if pristineErr != nil {
		return "", pristineErr
	}
	return pristine.catalog, nil
}

// reset puts conn's database back to the pristine state and returns its
// catalog's fingerprint then, or fails with errChanged when the catalog is
// no longer the one it had when handed out.
func reset(ctx context.Context, conn *pgx.Conn, catalogWas string) (string, error) {
	var catalog string
	if err := conn.QueryRow(ctx, catalogQuery).Scan(&catalog); err != nil {
		return "", err
	}
	if catalog != catalogWas {
		return "", errChanged
	}
	// The tables written, in one statement.
	var probes []string
	for i, table := range pristine.empty {
		probes = append(probes, fmt.Sprintf(`SELECT %d WHERE EXISTS (SELECT FROM %s)`, i, table))
	}
	rows, err := conn.Query(ctx, strings.Join(probes, " UNION ALL "))
	if err != nil {
		return "", err
	}
	written, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return "", err
	}
	// One transaction. No trigger fires (the append-only guards). TRUNCATE
	// rather than DELETE: a table's size on disk is state too (the queue's
	// statistics read it). CASCADE: an unwritten table that references a
	// written one is truncated with it; the template's rows are checked
	// after it.
	stmts := []string{"BEGIN", "SET LOCAL session_replication_role = replica"}
	if len(written) > 0 {
		var tables []string
		for _, i := range written {
			tables = append(tables, pristine.empty[i])
		}
		stmts = append(stmts, "TRUNCATE "+strings.Join(tables, ", ")+" CASCADE")
	}
	if _, err := conn.Exec(ctx, strings.Join(stmts, "; ")); err != nil {
		return "", err
	}
	err = func() error {
		for table, rowsJSON := range pristine.rows {
			var same bool
			if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) IS NOT DISTINCT FROM $1 FROM %s t`, table), pristine.rowsHash[table]).Scan(&same); err != nil {
				return err
			}
			if same {
				continue
			}
			if _, err := conn.Exec(ctx, "DELETE FROM "+table); err != nil {
				return err
			}
			if _, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s OVERRIDING SYSTEM VALUE SELECT * FROM json_populate_recordset(NULL::%s, $1)`, table, table), rowsJSON); err != nil {
				return err
			}
		}
		_, err := conn.Exec(ctx, `
SELECT setval(name::regclass, value, called) FROM unnest($1::text[], $2::bigint[], $3::bool[]) AS s(name, value, called)`,
			pristine.sequenceNames, pristine.sequenceValues, pristine.sequenceCalled)
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, `SELECT pg_stat_reset()`)
		return err
	}()
	if err != nil {
		_, _ = conn.Exec(ctx, "ROLLBACK")
		return "", err
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return "", err
	}
	if err := conn.QueryRow(ctx, catalogQuery).Scan(&catalog); err != nil {
		return "", err
	}
	return catalog, nil
}
