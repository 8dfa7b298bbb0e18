package ledger_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// requirePlans prepares query on b's database and requires its plan, custom
// and generic (on tables never analyzed, as autovacuum may leave them), to
// use the index want and none of avoid.
func requirePlans(t *testing.T, b *testBundle, query, execute, want string, avoid ...string) {
	t.Helper()
	requirePlansIn(t, b, []string{"force_custom_plan", "force_generic_plan"}, query, execute, want, avoid...)
}

// requirePlansIn is requirePlans for the plan cache modes modes only: a
// statement run planFresh is always planned for its parameters (custom).
func requirePlansIn(t *testing.T, b *testBundle, modes []string, query, execute, want string, avoid ...string) {
	t.Helper()
	checkPlans(t, b, modes, query, execute, func(mode, text string) {
		require.Contains(t, text, want, "%s:\n%s", mode, text)
		for _, index := range avoid {
			require.NotContains(t, text, index, "%s:\n%s", mode, text)
		}
	})
}

// checkPlans prepares query on b's database and hands check the text of
// its plan, EXPLAIN EXECUTE q<execute>, under each plan cache mode of modes.
func checkPlans(t *testing.T, b *testBundle, modes []string, query, execute string, check func(mode, text string)) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `PREPARE q AS `+query)
	require.NoError(t, err)
	defer conn.Exec(ctx, `DEALLOCATE q`) //nolint:errcheck
	for _, mode := range modes {
		_, err = conn.Exec(ctx, `SET plan_cache_mode = `+mode)
		require.NoError(t, err)
		rows, err := conn.Query(ctx, `EXPLAIN EXECUTE q`+execute)
		require.NoError(t, err)
		var plan []string
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		check(mode, strings.Join(plan, "\n"))
	}
	_, err = conn.Exec(ctx, `RESET plan_cache_mode`)
	require.NoError(t, err)
}

// The hot statements find their rows by key under every plan Postgres may
// choose, so their cost never grows with the tables.
func TestPlans(t *testing.T) {
	ctx, b := setup(t, setupOpts{noCustomer: true})
	var events []ledger.UsageEventParams
	for i := range 500 {
		id := fmt.Sprintf("cust-%04d", i)
		b.Customer(t, id)
		events = append(events, ledger.UsageEventParams{CustomerID: id, EventID: "first", AmountCents: 100})
	}
	_, err := b.Ledger.UsageEventRecordBatch(ctx, events) // 500 open periods
	require.NoError(t, err)

	t.Run("ChargeHistory", func(t *testing.T) {
		// 500 succeeded charges of other customers: the guard must not read them.
		_, err := b.Pool.Exec(ctx, `
INSERT INTO billing.charges (customer_id, period, status, amount_cents, currency, event_count, stripe_customer_id,
                             charge_key, idempotency_key, period_starts_at, created_at, updated_at)
SELECT p.customer_id, p.period, 'pending', 100, 'usd', 1, 'cus_' || p.customer_id,
       'k:' || p.customer_id, 'i:' || p.customer_id, p.starts_at, now(), now()
FROM billing.periods p`)
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `UPDATE billing.charges SET status = 'succeeded', stripe_payment_intent_id = 'pi_' || id`)
		require.NoError(t, err)
		requirePlans(t, b, ledger.ChargeHistorySQL, `('cust-0042', 1, 6)`, "charges_customer_succeeded_idx", "charges_status_idx")
	})

	t.Run("UsageEventInsertOpen", func(t *testing.T) {
		// With the period's status and close time in the lookup, the planner
		// picked the partial index of open periods and filtered every one.
		now := ledgertest.ClockStart.Format(time.RFC3339)
		requirePlans(t, b, ledger.UsageEventInsertOpenSQL, fmt.Sprintf(`('cust-0042', 'e1', '2026-11', 100, '', NULL, NULL,
  '{}', '%s', '%s', '\x%s')`, now, now, strings.Repeat("00", 32)), "periods_pkey", "periods_open_closes_at_idx")
	})

	t.Run("UsageEventsInsertOpen", func(t *testing.T) {
		// A group of single events (or a batch) finds each period by its
		// key too: with a join, ten events over 500 periods made the
		// planner hash the periods table.
		now := ledgertest.ClockStart.Format(time.RFC3339)
		hash := `"\\x` + strings.Repeat("00", 32) + `"`
		var customers, ids []string
		for i := range 10 {
			customers, ids = append(customers, fmt.Sprintf("cust-%04d", 40+i)), append(ids, fmt.Sprintf("e%d", i))
		}
		list := func(v string) string { return "'{" + strings.Repeat(v+",", 9) + v + "}'" }
		requirePlans(t, b, ledger.UsageEventsInsertOpenSQL, fmt.Sprintf(`('{%s}', '{%s}', %s, %s, %s, %s, %s, %s, %s, '%s', %s)`,
			strings.Join(customers, ","), strings.Join(ids, ","), list("2026-11"), list("100"), list(`""`), list("NULL"),
			list("NULL"), list(`"{}"`), list(now), now, list(hash)), "periods_pkey", "periods_open_closes_at_idx", "Seq Scan on periods")
	})

	t.Run("PeriodSums", func(t *testing.T) {
		// A customer's periods with their sums read the customer's
		// partition of the ledger alone, under either plan: with the sums
		// correlated on p.customer_id, each was planned over all sixteen,
		// and a page of 300 periods spent 200 ms in JIT.
		partition := regexp.MustCompile(`usage_events_p\d\d`)
		checkPlans(t, b, []string{"force_custom_plan", "force_generic_plan"}, ledger.PeriodSelectSQL+` WHERE p.customer_id = $1`,
			`('cust-0042')`, func(mode, text string) {
				seen := map[string]bool{}
				for _, p := range partition.FindAllString(text, -1) {
					seen[p] = true
				}
				require.Len(t, seen, 1, "%s: one partition of usage_events:\n%s", mode, text)
			})
	})
}

// The functions single events are written by (migration 00030) are their
// statements word for word, so that TestPlans holds the plans the functions
// cache, and a change to a statement needs a migration that changes its
// function too.
func TestInsertFunctionsAreTheStatements(t *testing.T) {
	ctx, b := setup(t, setupOpts{noCustomer: true})
	for name, statement := range map[string]string{
		"usage_event_insert_open":  ledger.UsageEventInsertOpenSQL,
		"usage_events_insert_open": ledger.UsageEventsInsertOpenSQL,
	} {
		var body string
		require.NoError(t, b.Pool.QueryRow(ctx, `
SELECT prosrc FROM pg_proc WHERE proname = $1 AND pronamespace = 'billing'::regnamespace`, name).Scan(&body))
		require.Equal(t, "\n#variable_conflict use_column\nBEGIN\nRETURN QUERY"+statement+";\nEND;\n", body,
			"billing.%s is not the statement internal/ledger has: write a migration that replaces it", name)
	}
}
