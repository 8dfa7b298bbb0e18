package sql_test

import (
	"context"
	"database/sql"
	"io/fs"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for goose
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	tallysql "github.com/tally-billing/tally/sql"

	"github.com/tally-billing/tally/internal/tools/testdb"
)

// provider returns a goose provider of the migrations for the database at
// url, and closes its connection when the test ends.
func provider(t *testing.T, url string) *goose.Provider {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.ExecContext(t.Context(), `CREATE SCHEMA IF NOT EXISTS billing`)
	require.NoError(t, err)
	fsys, err := fs.Sub(tallysql.Migrations, "migrations")
	require.NoError(t, err)
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName("billing.goose_db_version"), goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	return p
}

// migrateTo applies the migrations up to version on the database at url.
func migrateTo(ctx context.Context, t *testing.T, url string, version int64) {
	t.Helper()
	_, err := provider(t, url).UpTo(ctx, version)
	require.NoError(t, err)
}

// migrationDB is an empty database for a migration's test, a connection to
// it (closed when the test ends) and two helpers over that connection.
type migrationDB struct {
	t    *testing.T
	ctx  context.Context
	url  string
	conn *pgx.Conn
}

// newMigrationDB migrates it up to version (none for 0).
func newMigrationDB(t *testing.T, version int64) *migrationDB {
	t.Helper()
	d := &migrationDB{t: t, ctx: t.Context(), url: testdb.NewEmpty(t)}
	if version > 0 {
		migrateTo(d.ctx, t, d.url, version)
	}
	conn, err := pgx.Connect(d.ctx, d.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	d.conn = conn
	return d
}

// exec runs sql, which must succeed.
func (d *migrationDB) exec(sql string, args ...any) {
	d.t.Helper()
	_, err := d.conn.Exec(d.ctx, sql, args...)
	require.NoError(d.t, err)
}

// text returns the one value sql reads, as text.
func (d *migrationDB) text(sql string, args ...any) (s string) {
	d.t.Helper()
	require.NoError(d.t, d.conn.QueryRow(d.ctx, sql, args...).Scan(&s))
	return s
}

// constraints lists the constraints of tables (primary keys, unique,
// foreign keys, checks), one line each, sorted; a partition's clones of its
// parent's are left out.
func (d *migrationDB) constraints(tables ...string) string {
	d.t.Helper()
	return d.text(`
SELECT coalesce(string_agg(conrelid::regclass || ' ' || conname || ': ' || pg_get_constraintdef(oid), E'\n'
                           ORDER BY conrelid::regclass::text, conname), '')
FROM pg_constraint WHERE conrelid = ANY ($1::regclass[]) AND conparentid = 0`, tables)
}

// Migration 00025 gives every charge made before it its lines, so that a
// charge is the sum of its lines whenever it was made, and the
// reconciliation holds every charge to them.
func TestMigration00025ChargeLines(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testdb.NewEmpty(t)
	migrateTo(ctx, t, url, 24)

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `
INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at)
VALUES ('acme', 'cus_1', 'usd', now(), now());
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, created_at, status, closed_at)
SELECT 'acme', p, 'usd', now() - interval '1 day', now(), now(), now(), 'closed', now() FROM unnest(ARRAY['p1', 'p2', 'p3', 'p4']) AS p;
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, occurred_at, received_at, payload_hash)
VALUES ('acme', 'e1', 'p1', 30, 'usd', now(), now(), convert_to(repeat('h', 32), 'UTF8')), ('acme', 'e2', 'p2', 500, 'usd', now(), now(), convert_to(repeat('h', 32), 'UTF8')),
       ('acme', 'e3', 'p2', 700, 'usd', now(), now(), convert_to(repeat('h', 32), 'UTF8'));
-- p1: 30 cents, carried forward; p2: 1200 cents of events plus the 30
-- carried in; p3: no events (skipped); p4: nothing but a carried amount.
INSERT INTO billing.charges (id, customer_id, period, status, amount_cents, currency, event_count, stripe_customer_id,
                             charge_key, idempotency_key, created_at, updated_at, period_starts_at, carried_in_cents)
OVERRIDING SYSTEM VALUE
VALUES (1, 'acme', 'p1', 'carried_forward', 30, 'usd', 1, 'cus_1', 'k1', 'i1', now(), now(), now(), 0),
       (2, 'acme', 'p2', 'pending', 1230, 'usd', 2, 'cus_1', 'k2', 'i2', now(), now(), now(), 30),
       (3, 'acme', 'p3', 'skipped', 0, 'usd', 0, 'cus_1', 'k3', 'i3', now(), now(), now(), 0),
       (4, 'acme', 'p4', 'pending', 60, 'usd', 0, 'cus_1', 'k4', 'i4', now(), now(), now(), 60);
UPDATE billing.charges SET carried_into = 2 WHERE id = 1`)
	require.NoError(t, err)

	migrateTo(ctx, t, url, 25)
	rows, err := conn.Query(ctx, `SELECT charge_id, line, kind, event_count, amount_cents FROM billing.charge_lines ORDER BY 1, 2`)
	require.NoError(t, err)
	type line struct {
		Charge, Line int64
		Kind         string
		Events       int64
		Amount       int64
	}
	lines, err := pgx.CollectRows(rows, pgx.RowToStructByPos[line])
	require.NoError(t, err)
	require.Equal(t, []line{
		{1, 1, "pre_priced", 1, 30},
		{2, 1, "pre_priced", 2, 1200}, {2, 2, "carried", 0, 30},
		{4, 1, "carried", 0, 60},
	}, lines)
	var disagreements int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM billing.reconciliation`).Scan(&disagreements))
	require.Zero(t, disagreements, "every charge made before agrees with its lines")
}

// Migration 00026 rolls up the ledger as it stands (voids netted out) and
// starts its watermark after it, so the roll-up job adds only what comes
// later; down and up again gives the same.
func TestMigration00026UsageRollups(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := testdb.NewEmpty(t)
	migrateTo(ctx, t, url, 25)

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `
INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at)
VALUES ('acme', 'cus_1', 'usd', now(), now());
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, created_at)
VALUES ('acme', 'p1', 'usd', '2026-11-01', '2026-12-01', '2026-12-02', now());
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, quantity, metric, occurred_at, received_at, payload_hash)
VALUES ('acme', 'e1', 'p1', 30, 'usd', NULL, NULL, '2026-11-03 10:15Z', now(), convert_to(repeat('h', 32), 'UTF8')),
       ('acme', 'e2', 'p1', NULL, 'usd', 7.5, 'api_calls', '2026-11-03 11:45Z', now(), convert_to(repeat('h', 32), 'UTF8')),
       ('acme', 'e3', 'p1', 1000, 'usd', NULL, NULL, '2026-11-03 10:50Z', now(), convert_to(repeat('h', 32), 'UTF8'));
INSERT INTO billing.usage_event_voids (customer_id, event_id, period, reason, voided_by, voided_at)
VALUES ('acme', 'e3', 'p1', 'test', 'cli:test', now())`)
	require.NoError(t, err)

	check := func() {
		t.Helper()
		rows, err := conn.Query(ctx, `
SELECT metric || ' ' || to_char(bucket_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') || ' ' || events || ' ' || quantity || ' ' || amount_cents
FROM billing.usage_rollups ORDER BY metric`)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{
			" 2026-11-03 10:00 1 0 30", // pre-priced; e3 voided
			"api_calls 2026-11-03 11:00 1 7.5 0",
		}, got)
		var eventID, voidID int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT event_id, void_id FROM billing.usage_rollup_watermark`).Scan(&eventID, &voidID))
		require.Equal(t, []int64{3, 1}, []int64{eventID, voidID}, "the watermark after what is rolled up")
	}
	migrateTo(ctx, t, url, 26)
	check()

	p := provider(t, url)
	_, err = p.DownTo(ctx, 25)
	require.NoError(t, err)
	var scan int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT last_event_id FROM billing.usage_threshold_scan`).Scan(&scan))
	require.Equal(t, int64(3), scan)
	migrateTo(ctx, t, url, 26)
	check()
}

// usageEventsShape describes billing.usage_events as a reader and a writer
// see it: its columns (type, null, identity, default, comment, grants), its
// constraints, indexes, triggers (with their comments), comment, grants and
// owner, its identity sequence, the foreign keys to it, and every view of
// schema billing (definition, comment, grants), one line each, sorted. A
// partitioned index prints as ON ONLY the table; that is left out.
func usageEventsShape(ctx context.Context, t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(ctx, `
SELECT 'column ' || a.attname || ': ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || ' identity=' || a.attidentity::text || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
       || ' comment=' || coalesce(col_description(a.attrelid, a.attnum), '') || ' acl=' || coalesce(a.attacl::text, '')
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = 'billing.usage_events'::regclass AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || conname || ': ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'billing.usage_events'::regclass
UNION ALL
SELECT 'index ' || i.indexrelid::regclass || ': ' || replace(pg_get_indexdef(i.indexrelid), ' ON ONLY ', ' ON ')
FROM pg_index i WHERE i.indrelid = 'billing.usage_events'::regclass
UNION ALL
SELECT 'trigger ' || tgname || ': ' || pg_get_triggerdef(oid) || ' comment=' || coalesce(obj_description(oid, 'pg_trigger'), '')
FROM pg_trigger WHERE tgrelid = 'billing.usage_events'::regclass AND NOT tgisinternal
UNION ALL
SELECT 'table: comment=' || coalesce(obj_description(oid, 'pg_class'), '') || ' acl=' || coalesce(relacl::text, '')
       || ' owner=' || pg_get_userbyid(relowner)
FROM pg_class WHERE oid = 'billing.usage_events'::regclass
UNION ALL
SELECT 'sequence ' || pg_get_serial_sequence('billing.usage_events', 'id') || ': ' || format_type(seqtypid, NULL) || ' '
       || seqstart || ' ' || seqincrement || ' ' || seqmin || ' ' || seqmax || ' ' || seqcache || ' ' || seqcycle
FROM pg_sequence WHERE seqrelid = pg_get_serial_sequence('billing.usage_events', 'id')::regclass
UNION ALL
SELECT 'referenced by ' || conrelid::regclass || ' ' || conname || ': ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE confrelid = 'billing.usage_events'::regclass AND conparentid = 0
UNION ALL
SELECT 'view ' || c.oid::regclass || ': ' || pg_get_viewdef(c.oid) || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '')
       || ' acl=' || coalesce(c.relacl::text, '')
FROM pg_class c WHERE c.relkind IN ('v', 'm') AND c.relnamespace = 'billing'::regnamespace
ORDER BY 1`)
	require.NoError(t, err)
	shape, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return shape
}

// requirePgError requires err to be Postgres' error code, its message
// containing contains, and returns the constraint it names, if any.
func requirePgError(t *testing.T, err error, code, contains string) (constraint string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, code, pgErr.Code, pgErr.Message)
	require.Contains(t, pgErr.Message, contains)
	return pgErr.ConstraintName
}

// Migration 00031 partitions billing.usage_events by hash of customer_id
// (GitHub issue 27) on a ledger as it stands: every event kept with its id,
// the identity carrying on from where it was, and every guarantee of the
// table holding on the partitioned one — and on each partition, written to
// directly. Down makes it one table again, as it was.
func TestMigration00031PartitionedUsageEvents(t *testing.T) {
	t.Parallel()
	d := newMigrationDB(t, 0)
	ctx, url, conn, exec, text := d.ctx, d.url, d.conn, d.exec, d.text
	const (
		eventsJSON = `SELECT json_agg(e ORDER BY id)::text FROM billing.usage_events e`
		voidsJSON  = `SELECT json_agg(v ORDER BY id)::text FROM billing.usage_event_voids v`
		sequence   = `SELECT last_value || ' ' || is_called FROM billing.usage_events_id_seq`
		insert     = `
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, quantity, metric, occurred_at, received_at, payload_hash)
VALUES ($1, $2, $3, $4, 'usd', $5, $6, '2026-11-03 10:15Z', '2026-11-03 10:15Z', sha256(convert_to($2, 'UTF8')))`
	)

	// Before 00024: an event with an amount and a quantity (a label then),
	// which usage_events_amount_or_quantity (NOT VALID) leaves as it is.
	migrateTo(ctx, t, url, 23)
	exec(`
INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at)
SELECT c, 'cus_' || c, 'usd', now(), now() FROM unnest(ARRAY['acme', 'c1', 'c2', 'c3', 'c4', 'c5', 'c6', 'c7']) AS c;
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, created_at)
SELECT customer_id, '2026-11', 'usd', '2026-11-01', '2026-12-01', '2026-12-02', now() FROM billing.customers`)
	exec(`
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, quantity, metric, properties, occurred_at, received_at, payload_hash)
VALUES ('acme', 'legacy', '2026-11', 250, 'usd', 3, 'calls', '{"region":"eu"}', '2026-11-02 09:00Z', now(), sha256('legacy'))`)

	// At 00030: pre-priced and quantity events of eight customers, two of
	// them voided, and ids taken by a transaction rolled back.
	migrateTo(ctx, t, url, 30)
	for i, c := range []string{"acme", "c1", "c2", "c3", "c4", "c5", "c6", "c7"} {
		exec(insert, c, "e1", "2026-11", 100+i, nil, nil)
		exec(insert, c, "e2", "2026-11", nil, "7.5", "api_calls")
		exec(insert, c, "e3", "2026-11", 1000, nil, "label")
	}
	exec(`
INSERT INTO billing.usage_event_voids (customer_id, event_id, period, reason, voided_by, voided_at)
VALUES ('acme', 'e1', '2026-11', 'test', 'cli:test', now()), ('c3', 'e2', '2026-11', 'test', 'cli:test', now())`)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, insert, "acme", "rolled-back", "2026-11", 1, nil, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, "26 true", text(sequence), "1 + 24 events, 1 id rolled back")

	shape30 := usageEventsShape(ctx, t, conn)
	events, voids, counted := text(eventsJSON), text(voidsJSON), text(`SELECT count(*)::text FROM billing.usage_events_counted`)
	require.Equal(t, "23", counted)

	migrateTo(ctx, t, url, 31)

	t.Run("SameEventsPartitioned", func(t *testing.T) {
		require.Equal(t, events, text(eventsJSON), "every event, with its id")
		require.Equal(t, voids, text(voidsJSON))
		require.Equal(t, counted, text(`SELECT count(*)::text FROM billing.usage_events_counted`))
		require.Equal(t, "26 true", text(sequence), "the identity where it was")
		require.Equal(t, "p h 16", text(`
SELECT c.relkind::text || ' ' || p.partstrat::text || ' ' || (SELECT count(*) FROM pg_inherits WHERE inhparent = c.oid)
FROM pg_class c JOIN pg_partitioned_table p ON p.partrelid = c.oid WHERE c.oid = 'billing.usage_events'::regclass`))
		require.Equal(t, "usage_events_p00 FOR VALUES WITH (modulus 16, remainder 0) .. usage_events_p15 FOR VALUES WITH (modulus 16, remainder 15)", text(`
SELECT min(relname || ' ' || pg_get_expr(relpartbound, oid)) || ' .. ' || max(relname || ' ' || pg_get_expr(relpartbound, oid))
FROM pg_class WHERE oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'billing.usage_events'::regclass)`))
		require.Equal(t, "true", text(`SELECT (count(DISTINCT tableoid) > 1)::text FROM billing.usage_events`), "the events spread over partitions")

		// The shape is the table's but for its primary key, which holds the
		// partition key.
		want := make([]string, 0, len(shape30))
		for _, line := range shape30 {
			switch {
			case strings.HasPrefix(line, "constraint usage_events_pkey:"):
				line = "constraint usage_events_pkey: PRIMARY KEY (id, customer_id)"
			case strings.HasPrefix(line, "index billing.usage_events_pkey:"):
				line = "index billing.usage_events_pkey: CREATE UNIQUE INDEX usage_events_pkey ON billing.usage_events USING btree (id, customer_id)"
			}
			want = append(want, line)
		}
		require.Equal(t, want, usageEventsShape(ctx, t, conn))
	})

	t.Run("IdsCarryOn", func(t *testing.T) {
		var id int64
		require.NoError(t, conn.QueryRow(ctx, insert+` RETURNING id`, "c5", "after", "2026-11", 5, nil, nil).Scan(&id))
		require.Equal(t, int64(27), id, "after the id rolled back, not after max(id)")
	})

	t.Run("EventKeyUnique", func(t *testing.T) {
		_, err := conn.Exec(ctx, insert, "c2", "e1", "2026-11", 5, nil, nil)
		require.Regexp(t, `^usage_events_p[0-9]{2}_customer_event_key$`, requirePgError(t, err, "23505", "duplicate key"))
		tag, err := conn.Exec(ctx, insert+` ON CONFLICT (customer_id, event_id) DO NOTHING`, "c2", "e1", "2026-11", 5, nil, nil)
		require.NoError(t, err)
		require.Zero(t, tag.RowsAffected())
		_, err = conn.Exec(ctx, insert, "c2", "both", "2026-11", 5, "1", "calls")
		requirePgError(t, err, "23514", "usage_events_amount_or_quantity")
	})

	acmes := text(`SELECT DISTINCT tableoid::regclass::text FROM billing.usage_events WHERE customer_id = 'acme'`)
	require.Regexp(t, `^billing\.usage_events_p[0-9]{2}$`, acmes)

	t.Run("AppendOnly", func(t *testing.T) {
		for _, table := range []string{"billing.usage_events", acmes} {
			for _, stmt := range []string{
				"UPDATE " + table + " SET amount_cents = 1 WHERE customer_id = 'acme'",
				"DELETE FROM " + table + " WHERE customer_id = 'acme'",
				"TRUNCATE " + table + " CASCADE", // without CASCADE, refused for the voids' foreign key
			} {
				_, err := conn.Exec(ctx, stmt)
				requirePgError(t, err, "P0001", "append-only")
			}
		}
		require.Equal(t, events, text(`SELECT json_agg(e ORDER BY id)::text FROM billing.usage_events e WHERE id <= 26`))
	})

	t.Run("PeriodExists", func(t *testing.T) {
		_, err := conn.Exec(ctx, insert, "acme", "x1", "1999-01", 5, nil, nil)
		requirePgError(t, err, "23503", "period 1999-01 of customer acme does not exist")
		_, err = conn.Exec(ctx, `INSERT INTO `+acmes+` (id, customer_id, event_id, period, amount_cents, currency, occurred_at, received_at, payload_hash)
VALUES (1000, 'acme', 'x2', '1999-01', 5, 'usd', now(), now(), sha256('x2'))`)
		requirePgError(t, err, "23503", "period 1999-01 of customer acme does not exist")

		// One check per statement on the partitioned table, however many
		// partitions its rows go to.
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // the test's rows only
		_, err = tx.Exec(ctx, `SET LOCAL track_functions = 'pl'`)
		require.NoError(t, err)
		tag, err := tx.Exec(ctx, `
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, occurred_at, received_at, payload_hash)
SELECT customer_id, 'x3', '2026-11', 5, 'usd', now(), now(), sha256('x3') FROM billing.customers`)
		require.NoError(t, err)
		require.Equal(t, int64(8), tag.RowsAffected())
		var calls int64
		require.NoError(t, tx.QueryRow(ctx, `
SELECT calls FROM pg_stat_xact_user_functions WHERE schemaname = 'billing' AND funcname = 'usage_events_period_exists'`).Scan(&calls))
		require.Equal(t, int64(1), calls)
	})

	t.Run("VoidsReferenceEvents", func(t *testing.T) {
		_, err := conn.Exec(ctx, `
INSERT INTO billing.usage_event_voids (customer_id, event_id, period, reason, voided_by, voided_at)
VALUES ('acme', 'nope', '2026-11', 'test', 'cli:test', now())`)
		require.Equal(t, "usage_event_voids_customer_id_event_id_fkey", requirePgError(t, err, "23503", "violates foreign key"))
		exec(`
INSERT INTO billing.usage_event_voids (customer_id, event_id, period, reason, voided_by, voided_at)
VALUES ('c5', 'after', '2026-11', 'test', 'cli:test', now())`)
		require.Equal(t, "23", text(`SELECT count(*)::text FROM billing.usage_events_counted`), "one more event, one more void")
	})

	// Down: one table again, the same events, the same shape as before.
	events, voids = text(eventsJSON), text(voidsJSON)
	seq := text(sequence)
	_, err = provider(t, url).DownTo(ctx, 30)
	require.NoError(t, err)
	require.Equal(t, "r", text(`SELECT relkind::text FROM pg_class WHERE oid = 'billing.usage_events'::regclass`))
	require.Equal(t, "0", text(`SELECT count(*)::text FROM pg_class WHERE relname LIKE 'usage\_events\_p__'`))
	require.Equal(t, events, text(eventsJSON))
	require.Equal(t, voids, text(voidsJSON))
	require.Equal(t, seq, text(sequence))
	require.Equal(t, shape30, usageEventsShape(ctx, t, conn))
	_, err = conn.Exec(ctx, `UPDATE billing.usage_events SET amount_cents = 1`)
	requirePgError(t, err, "P0001", "append-only")

	// And partitioned again.
	migrateTo(ctx, t, url, 31)
	require.Equal(t, events, text(eventsJSON))
	require.Equal(t, "p", text(`SELECT relkind::text FROM pg_class WHERE oid = 'billing.usage_events'::regclass`))
}

// Migration 00032 gives top-ups, their transitions, the grants they bought
// and the voids keys and foreign keys that include customer_id (the Citus
// shape, docs/scaling.md) on a ledger as it stands: each transition gets its
// top-up's customer, a grant can no longer name another customer's top-up,
// and Down gives the schema back as it was.
func TestMigration00032CitusTopUps(t *testing.T) {
	t.Parallel()
	d := newMigrationDB(t, 31)
	ctx, url, conn, exec, text := d.ctx, d.url, d.conn, d.exec, d.text
	keys := func() string {
		return d.constraints("billing.top_ups", "billing.top_up_transitions", "billing.credit_grants", "billing.usage_event_voids")
	}
	const transitions = `SELECT string_agg(id || ' ' || top_up || ' ' || to_status, ',' ORDER BY id) FROM billing.top_up_transitions`
	exec(`
INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at)
VALUES ('acme', 'cus_1', 'usd', now(), now()), ('beta', 'cus_2', 'usd', now(), now());
INSERT INTO billing.top_ups (id, customer_id, top_up_id, source, status, amount_cents, currency, category, priority,
                             stripe_customer_id, top_up_key, key_namespace, stripe_payment_intent_id, created_at, created_by, updated_at)
OVERRIDING SYSTEM VALUE
VALUES (1, 'acme', 't1', 'api', 'succeeded', 500, 'usd', 'paid', 0, 'cus_1', 'k1', 'test', 'pi_1', now(), 'api:test', now()),
       (2, 'beta', 't1', 'api', 'pending', 700, 'usd', 'paid', 0, 'cus_2', 'k2', 'test', NULL, now(), 'api:test', now());
INSERT INTO billing.top_up_transitions (top_up, from_status, to_status, actor, created_at)
VALUES (1, NULL, 'pending', 'api:test', now()), (2, NULL, 'pending', 'api:test', now()),
       (1, 'pending', 'succeeded', 'job:1/1', now());
INSERT INTO billing.credit_grants (customer_id, grant_id, amount_cents, currency, category, priority, created_at, created_by, top_up_id)
VALUES ('acme', 'top_up:t1', 500, 'usd', 'paid', 0, now(), 'job:1/1', 1)`)
	keys31, transitions31 := keys(), text(transitions)

	migrateTo(ctx, t, url, 32)
	require.Equal(t, "acme,beta,acme", text(`SELECT string_agg(customer_id, ',' ORDER BY id) FROM billing.top_up_transitions`))
	require.Equal(t, transitions31, text(transitions))
	_, err := conn.Exec(ctx, `
INSERT INTO billing.credit_grants (customer_id, grant_id, amount_cents, currency, category, priority, created_at, created_by, top_up_id)
VALUES ('beta', 'top_up:t1', 500, 'usd', 'paid', 0, now(), 'job:1/1', 1)`)
	require.Equal(t, "credit_grants_top_up_id_fkey", requirePgError(t, err, "23503", "violates foreign key"),
		"beta's grant naming acme's top-up")
	_, err = conn.Exec(ctx, `
INSERT INTO billing.top_up_transitions (top_up, customer_id, to_status, actor, created_at) VALUES (2, 'acme', 'failed', 'job:1/1', now())`)
	require.Equal(t, "top_up_transitions_top_up_fkey", requirePgError(t, err, "23503", "violates foreign key"))
	_, err = conn.Exec(ctx, `UPDATE billing.top_up_transitions SET reason = 'x'`)
	requirePgError(t, err, "P0001", "append-only")
	_, err = conn.Exec(ctx, `UPDATE billing.top_ups SET top_up_key = 'k1' WHERE id = 2 AND customer_id = 'beta'`)
	require.NoError(t, err, "a key unique per customer: derived from it, it cannot meet another's")

	exec(`UPDATE billing.top_ups SET top_up_key = 'k2' WHERE id = 2`)
	_, err = provider(t, url).DownTo(ctx, 31)
	require.NoError(t, err)
	require.Equal(t, keys31, keys())
	require.Equal(t, transitions31, text(transitions))
	require.Equal(t, "0", text(`SELECT count(*)::text FROM pg_attribute WHERE attrelid = 'billing.top_up_transitions'::regclass AND attname = 'customer_id'`))
}

// Migration 00033 gives notifications, their deliveries and attempts the
// customer their notification reports on, from its body, and keys and
// foreign keys that include it (the Citus shape); Down gives the schema
// back as it was.
func TestMigration00033CitusWebhooks(t *testing.T) {
	t.Parallel()
	d := newMigrationDB(t, 32)
	ctx, url, conn, exec, text := d.ctx, d.url, d.conn, d.exec, d.text
	keys := func() string {
		return d.constraints("billing.notifications", "billing.webhook_deliveries", "billing.webhook_attempts")
	}
	exec(`
INSERT INTO billing.webhook_endpoints (url, events, secret, created_at, updated_at)
VALUES ('https://a.example/hook', '{*}', 'whsec_test', now(), now());
INSERT INTO billing.notifications (id, type, body, created_at)
VALUES ('ntf_1', 'charge.succeeded', '{"data": {"object": {"customer_id": "acme", "id": 1}}}', now()),
       ('ntf_2', 'period.closed', '{"data": {"object": {"customer_id": "beta", "period": "2026-11"}}}', now());
INSERT INTO billing.webhook_deliveries (notification_id, endpoint_id, created_at, updated_at)
SELECT n, id, now(), now() FROM billing.webhook_endpoints, unnest(ARRAY['ntf_1', 'ntf_2']) n;
INSERT INTO billing.webhook_attempts (delivery_id, attempt, started_at, latency_ms, status_code)
SELECT id, 1, now(), 5, 500 FROM billing.webhook_deliveries`)
	keys32 := keys()

	migrateTo(ctx, t, url, 33)
	require.Equal(t, "ntf_1 acme,ntf_2 beta", text(`SELECT string_agg(id || ' ' || customer_id, ',' ORDER BY id) FROM billing.notifications`))
	require.Equal(t, "ntf_1 acme,ntf_2 beta", text(`
SELECT string_agg(d.notification_id || ' ' || a.customer_id, ',' ORDER BY d.notification_id)
FROM billing.webhook_attempts a JOIN billing.webhook_deliveries d ON d.id = a.delivery_id AND d.customer_id = a.customer_id`))
	_, err := conn.Exec(ctx, `
INSERT INTO billing.webhook_deliveries (notification_id, customer_id, endpoint_id, created_at, updated_at)
SELECT 'ntf_1', 'beta', id, now(), now() FROM billing.webhook_endpoints`)
	require.Equal(t, "webhook_deliveries_notification_id_fkey", requirePgError(t, err, "23503", "violates foreign key"),
		"a delivery of acme's notification named beta's")

	_, err = provider(t, url).DownTo(ctx, 32)
	require.NoError(t, err)
	require.Equal(t, keys32, keys())
	require.Equal(t, "0", text(`
SELECT count(*)::text FROM pg_attribute WHERE attname = 'customer_id' AND NOT attisdropped
  AND attrelid IN ('billing.notifications'::regclass, 'billing.webhook_deliveries'::regclass, 'billing.webhook_attempts'::regclass)`))
}

// Migration 00034 gives a charge's attempts, transitions, lines and
// statement, its refunds and disputes and their events the charge's
// customer, and every key and foreign key among them customer_id (the Citus
// shape); a refund recorded without its charge gets the customer of the
// charge its Stripe charge paid, and one of no charge stops the migration
// with what to do. Down gives the schema back as it was.
func TestMigration00034CitusCharges(t *testing.T) {
	t.Parallel()
	d := newMigrationDB(t, 33)
	ctx, url, conn, exec, text := d.ctx, d.url, d.conn, d.exec, d.text
	tables := []string{"billing.charges", "billing.charge_attempts", "billing.charge_transitions", "billing.charge_lines",
		"billing.statements", "billing.refunds", "billing.disputes", "billing.refund_events", "billing.dispute_events",
		"billing.credit_grant_entries", "billing.operator_actions"}
	indexes := func() string {
		return text(`SELECT string_agg(indexrelid::regclass || ': ' || pg_get_indexdef(indexrelid), E'\n' ORDER BY indexrelid::regclass::text)
FROM pg_index WHERE indrelid = ANY ($1::regclass[])`, tables)
	}
	exec(`
INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at)
VALUES ('acme', 'cus_1', 'usd', now(), now()), ('beta', 'cus_2', 'usd', now(), now());
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, created_at, status, closed_at)
SELECT c, '2026-11', 'usd', now() - interval '1 day', now(), now(), now(), 'closed', now() FROM unnest(ARRAY['acme', 'beta']) c;
INSERT INTO billing.charges (id, customer_id, period, status, amount_cents, currency, event_count, stripe_customer_id,
                             charge_key, idempotency_key, created_at, updated_at, period_starts_at, stripe_charge_id)
OVERRIDING SYSTEM VALUE
VALUES (1, 'acme', '2026-11', 'pending', 900, 'usd', 1, 'cus_1', 'k1', 'i1', now(), now(), now(), 'ch_1'),
       (2, 'beta', '2026-11', 'pending', 700, 'usd', 1, 'cus_2', 'k2', 'i2', now(), now(), now(), 'ch_2');
INSERT INTO billing.charge_attempts (charge_id, attempt, key_generation, idempotency_key, lease_owner, started_at)
VALUES (1, 1, 0, 'i1', 'w', now()), (2, 1, 0, 'i2', 'w', now());
INSERT INTO billing.charge_transitions (charge_id, to_status, actor, created_at) VALUES (1, 'pending', 'job:1/1', now()), (2, 'pending', 'job:2/1', now());
INSERT INTO billing.charge_lines (charge_id, line, kind, event_count, exact_amount, amount_cents, created_at)
VALUES (1, 1, 'pre_priced', 1, 900, 900, now()), (2, 1, 'pre_priced', 1, 700, 700, now());
INSERT INTO billing.statements (number, charge_id, issued_at) VALUES (1, 2, now());
INSERT INTO billing.refunds (stripe_refund_id, charge_id, stripe_charge_id, amount_cents, currency, stripe_created_at, recorded_at)
VALUES ('re_1', 1, 'ch_1', 100, 'usd', now(), now()), ('re_2', NULL, 'ch_2', 50, 'usd', now(), now());
INSERT INTO billing.refund_events (stripe_refund_id, status, observed_at, recorded_at)
VALUES ('re_1', 'succeeded', now(), now()), ('re_2', 'pending', now(), now());
INSERT INTO billing.disputes (stripe_dispute_id, charge_id, stripe_charge_id, amount_cents, currency, stripe_created_at, recorded_at, stripe_event_id)
VALUES ('dp_1', 2, 'ch_2', 700, 'usd', now(), now(), 'evt_1');
INSERT INTO billing.dispute_events (stripe_dispute_id, status, amount_cents, observed_at, recorded_at)
VALUES ('dp_1', 'needs_response', 700, now(), now());
INSERT INTO billing.operator_actions (action, charge_id, actor, reason, created_at) VALUES ('approve', 1, 'cli:ops', 'test', now())`)
	keys33, indexes33 := d.constraints(tables...), indexes()

	// A refund of no charge of Tally's stops the migration, with what to do.
	exec(`INSERT INTO billing.refunds (stripe_refund_id, charge_id, stripe_charge_id, amount_cents, currency, stripe_created_at, recorded_at)
VALUES ('re_x', NULL, 'ch_other', 10, 'usd', now(), now())`)
	_, err := provider(t, url).UpTo(ctx, 34)
	require.ErrorContains(t, err, "refunds or disputes of no charge of Tally's: re_x")
	exec(`ALTER TABLE billing.refunds DISABLE TRIGGER USER; DELETE FROM billing.refunds WHERE stripe_refund_id = 're_x';
ALTER TABLE billing.refunds ENABLE TRIGGER USER`)

	migrateTo(ctx, t, url, 34)
	for table, want := range map[string]string{
		"charge_attempts": "acme,beta", "charge_transitions": "acme,beta", "charge_lines": "acme,beta", "statements": "beta",
		"refunds": "acme,beta", "refund_events": "acme,beta", "disputes": "beta", "dispute_events": "beta",
	} {
		require.Equal(t, want, text(`SELECT string_agg(customer_id, ',' ORDER BY customer_id) FROM billing.`+table), table)
	}
	_, err = conn.Exec(ctx, `INSERT INTO billing.charge_transitions (charge_id, customer_id, to_status, actor, created_at)
VALUES (1, 'beta', 'pending', 'job:1/1', now())`)
	require.Equal(t, "charge_transitions_charge_id_fkey", requirePgError(t, err, "23503", "violates foreign key"),
		"a transition of acme's charge named beta's")
	_, err = conn.Exec(ctx, `INSERT INTO billing.refund_events (stripe_refund_id, customer_id, status, observed_at, recorded_at)
VALUES ('re_1', 'beta', 'failed', now(), now())`)
	require.Equal(t, "refund_events_stripe_refund_id_fkey", requirePgError(t, err, "23503", "violates foreign key"))
	_, err = conn.Exec(ctx, `UPDATE billing.charge_transitions SET reason = 'x'`)
	requirePgError(t, err, "P0001", "append-only")

	_, err = provider(t, url).DownTo(ctx, 33)
	require.NoError(t, err)
	require.Equal(t, keys33, d.constraints(tables...))
	require.Equal(t, indexes33, indexes())
	require.Equal(t, "0", text(`SELECT count(*)::text FROM pg_attribute WHERE attname = 'customer_id' AND NOT attisdropped
  AND attrelid = ANY ($1::regclass[]) AND attrelid NOT IN ('billing.charges'::regclass, 'billing.credit_grant_entries'::regclass)`, tables))
}
