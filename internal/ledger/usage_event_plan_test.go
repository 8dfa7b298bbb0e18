package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/ledgertest"
)

// The single-event statement finds its period by primary key under every
// plan Postgres may choose, on tables that were never analyzed: with the
// period's status and close time in the lookup, the planner picked the
// partial index of open periods and filtered every open period per event.
func TestUsageEventInsertOpenPlan(t *testing.T) {
	ctx := context.Background()
	b := ledgertest.New(t, ledger.Config{})
	var events []ledger.UsageEventParams
	for i := range 500 {
		id := fmt.Sprintf("cust-%04d", i)
		b.Customer(t, id)
		events = append(events, ledger.UsageEventParams{CustomerID: id, EventID: "first", AmountCents: 1})
	}
	_, err := b.Ledger.UsageEventRecordBatch(ctx, events) // 500 open periods
	require.NoError(t, err)

	conn, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `PREPARE insert_open AS `+ledger.UsageEventInsertOpenSQL)
	require.NoError(t, err)
	now := ledgertest.ClockStart.Format(time.RFC3339)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err = conn.Exec(ctx, `SET plan_cache_mode = `+mode)
		require.NoError(t, err)
		rows, err := conn.Query(ctx, fmt.Sprintf(`EXPLAIN EXECUTE insert_open('cust-0042', 'e1', '2026-11', 100, '', NULL, NULL,
  '{}', '%s', '%s', '\x%s')`, now, now, strings.Repeat("00", 32)))
		require.NoError(t, err)
		var plan []string
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		text := strings.Join(plan, "\n")
		require.Contains(t, text, "Index Scan using periods_pkey", "%s:\n%s", mode, text)
		require.NotContains(t, text, "periods_open_closes_at_idx", "%s:\n%s", mode, text)
	}
}
