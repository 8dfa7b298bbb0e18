package testdb

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { Main(m) }

// TestReuse: a database put back is the template's again, under a new
// name, and one whose schema a test changed is dropped. The subtests run
// in order, each taking the database the one before put back.
func TestReuse(t *testing.T) {
	ctx := context.Background()
	var first, second string
	var watermark string

	t.Run("WriteEverywhere", func(t *testing.T) {
		pool, u := New(t)
		first = dbName(t, u)
		require.NoError(t, pool.QueryRow(ctx, `SELECT row_to_json(w)::text FROM billing.usage_rollup_watermark w`).Scan(&watermark))
		execAll(t, pool,
			`INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at) VALUES ('acme', 'cus_acme', 'usd', now(), now())`,
			`INSERT INTO river.river_job (args, kind, max_attempts, queue, state) VALUES ('{}', 'k', 1, 'q', 'available')`,
			`UPDATE billing.usage_rollup_watermark SET event_id = event_id + 100`,
		)
	})
	require.Len(t, spare, 1, "put back")

	t.Run("TakesItBackAsTheTemplateLeftIt", func(t *testing.T) {
		pool, u := New(t)
		second = dbName(t, u)
		require.NotEqual(t, first, second, "renamed when put back")
		require.False(t, exists(t, first), "no database answers to the old name")
		for _, table := range []string{"billing.customers", "river.river_job"} {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
			require.Zero(t, n, table)
		}
		var w string
		require.NoError(t, pool.QueryRow(ctx, `SELECT row_to_json(w)::text FROM billing.usage_rollup_watermark w`).Scan(&w))
		require.Equal(t, watermark, w, "the template's row restored")
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO river.river_job (args, kind, max_attempts, queue, state) VALUES ('{}', 'k', 1, 'q', 'available') RETURNING id`).Scan(&id))
		require.Equal(t, int64(1), id, "the sequences restarted")
		// A schema change: this database is not put back.
		execAll(t, pool, `CREATE TABLE billing.scratch (id int)`)
	})
	require.Empty(t, spare, "a changed schema is dropped")
	require.False(t, exists(t, second))

	t.Run("FreshCloneAfterADrop", func(t *testing.T) {
		pool, _ := New(t)
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'billing' AND tablename = 'scratch'`).Scan(&n))
		require.Zero(t, n)
	})
}

func execAll(t *testing.T, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		_, err := pool.Exec(context.Background(), s)
		require.NoError(t, err, s)
	}
}

func dbName(t *testing.T, u string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	return strings.TrimPrefix(parsed.Path, "/")
}

func exists(t *testing.T, name string) bool {
	t.Helper()
	admin := adminConn(t)
	defer admin.Close(context.Background())
	var n int
	require.NoError(t, admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n))
	return n == 1
}
