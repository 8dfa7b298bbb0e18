package sql_test

import (
	"context"
	"database/sql"
	"io/fs"
	"testing"

	"github.com/jackc/pgx/v5"
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
