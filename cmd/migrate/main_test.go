package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/tools/testdb"
)

// testBundle is an empty database (no schema, no migration) that migrate
// runs against.
type testBundle struct {
	url string
}

func setup(ctx context.Context, t *testing.T) *testBundle {
	t.Helper()
	return &testBundle{url: testdb.NewEmpty(t)}
}

// migrate runs the command with args and returns its stdout.
func (b *testBundle) migrate(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, b.getenv, &stdout, &stderr)
	require.NoError(t, err, "migrate %v\nstdout: %s\nstderr: %s", args, &stdout, &stderr)
	return stdout.String()
}

func (b *testBundle) getenv(k string) string {
	if k == "DATABASE_URL" {
		return b.url
	}
	return ""
}

// tables returns the tables of schema, sorted.
func (b *testBundle) tables(ctx context.Context, t *testing.T, schema string) []string {
	t.Helper()
	conn, err := pgx.Connect(ctx, b.url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("BadUsage", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		var out bytes.Buffer
		require.ErrorContains(t, run(ctx, nil, b.getenv, &out, &out), "usage")
		require.ErrorContains(t, run(ctx, []string{"sideways"}, b.getenv, &out, &out), `"sideways"`)
		require.ErrorContains(t, run(ctx, []string{"up"}, func(string) string { return "" }, &out, &out), "DATABASE_URL")
		require.Error(t, run(ctx, []string{"down", "--everything"}, b.getenv, &out, &out))
		require.Empty(t, b.tables(ctx, t, "billing"), "nothing was applied")
	})

	t.Run("ConcurrentUps", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		const n = 2
		outs := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				var stdout, stderr bytes.Buffer
				errs[i] = run(ctx, []string{"up"}, b.getenv, &stdout, &stderr)
				outs[i] = stdout.String() + stderr.String()
			})
		}
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i], "output: %s", outs[i])
		}
		applied := 0
		for _, out := range outs {
			if strings.Contains(out, "tally: applied") {
				applied++
			} else {
				require.Contains(t, out, "nothing to apply")
			}
		}
		require.Equal(t, 1, applied, "exactly one of the runs applies: %q", outs)
		require.Contains(t, b.migrate(ctx, t, "up"), "nothing to apply")
	})

	t.Run("DownAllThenUp", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		b.migrate(ctx, t, "up")
		tablesUp := b.tables(ctx, t, "billing")

		out := b.migrate(ctx, t, "down", "--all")
		require.Contains(t, out, "tally: rolled back 00001_foundation.sql")
		require.Contains(t, out, "river: rolled back version 001")
		require.Equal(t, []string{"goose_db_version"}, b.tables(ctx, t, "billing"), "only goose's own table is left")
		require.Empty(t, b.tables(ctx, t, "river"))
		status := b.migrate(ctx, t, "status")
		for _, line := range strings.Split(strings.TrimSpace(status), "\n") {
			if strings.HasPrefix(line, "tally: ") {
				require.True(t, strings.HasSuffix(line, " pending"), line)
			}
		}
		require.Contains(t, status, "river: 0 of")

		out = b.migrate(ctx, t, "up")
		require.Contains(t, out, "tally: applied 00001_foundation.sql")
		require.Contains(t, out, "river: applied version 001")
		require.Equal(t, tablesUp, b.tables(ctx, t, "billing"))
		require.Contains(t, b.migrate(ctx, t, "up"), "nothing to apply")
	})

	t.Run("DownOnFreshDatabase", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		require.Contains(t, b.migrate(ctx, t, "down"), "nothing to roll back")
	})

	t.Run("DownOne", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		b.migrate(ctx, t, "up")
		out := b.migrate(ctx, t, "down")
		require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 1, out)
		require.True(t, strings.HasPrefix(out, "tally: rolled back "), out)
		require.Contains(t, b.migrate(ctx, t, "status"), "pending")

		out = b.migrate(ctx, t, "up")
		require.Contains(t, out, "tally: applied")
		require.NotContains(t, out, "river: applied")
	})

	t.Run("StatusLists", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		b.migrate(ctx, t, "up")
		out := b.migrate(ctx, t, "status")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.GreaterOrEqual(t, len(lines), 3, out)
		for _, line := range lines[:len(lines)-1] {
			require.Regexp(t, `^tally: \d{5}_\w+\.sql +applied \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`, line)
		}
		require.Contains(t, out, "00001_foundation.sql")
		require.Regexp(t, `^river: (\d+) of (\d+) versions applied$`, lines[len(lines)-1])
		var applied, all int
		_, err := fmt.Sscanf(lines[len(lines)-1], "river: %d of %d versions applied", &applied, &all)
		require.NoError(t, err)
		require.Equal(t, all, applied)
	})

	t.Run("StatusOnFreshDatabase", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		out := b.migrate(ctx, t, "status")
		require.Contains(t, out, "00001_foundation.sql")
		require.Contains(t, out, "pending")
		require.Contains(t, out, "river: 0 of")
	})

	t.Run("UpApplies", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		out := b.migrate(ctx, t, "up")
		require.Contains(t, out, "tally: applied 00001_foundation.sql")
		require.Contains(t, out, "river: applied version 001")
		require.Subset(t, b.tables(ctx, t, "billing"), []string{"api_keys", "customers", "periods", "usage_events"})
		require.Contains(t, b.tables(ctx, t, "river"), "river_job")
		require.Empty(t, b.tables(ctx, t, "public"), "nothing lands in schema public")
	})

	t.Run("UpTwiceHasNothingToApply", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		b.migrate(ctx, t, "up")
		require.Equal(t, "nothing to apply: tally and river migrations are current\n", b.migrate(ctx, t, "up"))
	})
}
