package chaos

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// TestCheckLines closes periods with Tally's ledger and holds their lines
// to checkLines: nothing found on the ledger as Tally wrote it (a voided
// event left out, the period rated with the version it opened with though
// a later one exists), and a violation for a charge rated with another
// plan than the check's or a line the events do not explain.
func TestCheckLines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := ledgertest.New(t, ledger.Config{})
	priceBook := func(p planDef) string {
		raw, err := json.Marshal(p)
		require.NoError(t, err)
		return string(raw)
	}
	book := planBook{}
	v1 := b.Plan(t, chaosPlanID, priceBook(chaosPlanVersions[0]))
	book.add(chaosPlanID, v1.Version, chaosPlanVersions[0])

	plan := chaosPlanID
	_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "tiered", StripeCustomerID: "cus_tiered", Currency: "usd", PlanID: &plan})
	require.NoError(t, err)
	b.Customer(t, "plain")
	for _, e := range []ledger.UsageEventParams{
		{CustomerID: "tiered", EventID: "a1", Metric: "api_calls", Quantity: "600.5"},
		{CustomerID: "tiered", EventID: "a2", Metric: "api_calls", Quantity: "399.5"}, // 1000: the first tier's bound
		{CustomerID: "tiered", EventID: "a3", Metric: "api_calls", Quantity: "5000"},  // voided below
		{CustomerID: "tiered", EventID: "s1", Metric: "storage_gb", Quantity: "10.001"},
		{CustomerID: "tiered", EventID: "p1", Metric: "seats", Quantity: "0"},
		{CustomerID: "tiered", EventID: "m1", AmountCents: 125, Metric: "chaos"},
		{CustomerID: "plain", EventID: "m1", AmountCents: 4000},
		{CustomerID: "plain", EventID: "m2", AmountCents: 21},
	} {
		_, err := b.Ledger.UsageEventRecord(ctx, e)
		require.NoError(t, err, e.EventID)
	}
	_, err = b.Ledger.UsageEventVoid(ctx, ledger.UsageEventVoidParams{CustomerID: "tiered", EventID: "a3", Reason: "sent twice", Actor: "cli:test"})
	require.NoError(t, err)
	// A new version once the period is open: the period keeps the first.
	v2 := b.Plan(t, chaosPlanID, priceBook(chaosPlanVersions[1]))
	book.add(chaosPlanID, v2.Version, chaosPlanVersions[1])
	charges := map[string]*ledger.Charge{}
	for _, id := range []string{"tiered", "plain"} {
		c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: id, Period: "2026-11", Actor: "job:1/1"})
		require.NoError(t, err)
		charges[id] = c
	}

	conn, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	violations, want, lines, err := checkLines(ctx, conn, book)
	require.NoError(t, err)
	require.Empty(t, violations)
	require.Equal(t, map[string]int{"usage chaos-tiered v1": 3, "usage of zero": 1, "usage on a bound": 1, "pre_priced": 2}, lines,
		"api_calls (1000, a bound), seats (0) and storage_gb lines on version 1 and a pre_priced line for tiered; pre_priced for plain")
	// 1000 × 0.5 + (10.001 × 20 + 50 = 250.02 → 250) + 0 + 125, worked out by hand.
	require.Equal(t, int64(875), want[periodKey{"tiered", "2026-11"}])
	require.Equal(t, int64(875), charges["tiered"].AmountCents)
	require.Equal(t, int64(4021), want[periodKey{"plain", "2026-11"}])

	t.Run("a plan rated otherwise", func(t *testing.T) {
		wrong := planBook{}
		wrong.add(chaosPlanID, v1.Version, chaosPlanVersions[1])
		violations, want, _, err := checkLines(ctx, conn, wrong)
		require.NoError(t, err)
		require.Len(t, violations, 2, "%q", violations) // api_calls and storage_gb; seats is 0 either way
		for _, v := range violations {
			require.Contains(t, v, "rated again (plan chaos-tiered version 1)")
		}
		// 1000 × 0.45 + (10.001 × 18.25 = 182.51825 → 183) + 0 + 125.
		require.Equal(t, int64(758), want[periodKey{"tiered", "2026-11"}])
	})

	t.Run("a line the events do not explain", func(t *testing.T) {
		_, err := conn.Exec(ctx, `
INSERT INTO billing.charge_lines (charge_id, customer_id, line, kind, event_count, exact_amount, amount_cents, created_at)
VALUES ($1, 'plain', 2, 'carried', 0, 7, 7, now())`, charges["plain"].ID)
		require.NoError(t, err)
		violations, _, _, err := checkLines(ctx, conn, book)
		require.NoError(t, err)
		got := strings.Join(violations, "\n")
		require.Contains(t, got, "charge of plain/2026-11 is 4021; its lines sum to 4028")
		require.Contains(t, got, "charge of plain/2026-11: its carried line is 7 cents for 0 events; want 0 for 0")
	})
}
