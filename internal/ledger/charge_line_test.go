package ledger_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// lineWant is what a test expects of a charge's line.
type lineWant struct {
	kind     ledger.ChargeLineKind
	metric   string
	quantity string // a usage line's, as stored
	events   int64
	exact    string // "" for the amount itself
	amount   int64
}

// requireLines requires charge c's lines to be want, in order, adding up to
// its amount, and the reconciliation to find nothing wrong with it.
func requireLines(t *testing.T, ctx context.Context, b *testBundle, c *ledger.Charge, want []lineWant) []ledger.ChargeLine {
	t.Helper()
	lines, err := b.Ledger.ChargeLines(ctx, c.ID)
	require.NoError(t, err)
	require.Len(t, lines, len(want))
	var sum int64
	for i, w := range want {
		l := lines[i]
		require.Equal(t, int32(i+1), l.Line)
		require.Equal(t, w.kind, l.Kind, "line %d", i+1)
		require.Equal(t, w.events, l.EventCount, "line %d", i+1)
		require.Equal(t, w.amount, l.AmountCents, "line %d", i+1)
		exact := w.exact
		if exact == "" {
			exact = l.ExactAmount.Text('f')
			require.Equal(t, w.amount, mustInt64(t, exact), "line %d: exact is the amount", i+1)
		}
		require.Equal(t, exact, l.ExactAmount.Text('f'), "line %d", i+1)
		if w.kind == ledger.ChargeLineUsage {
			require.NotNil(t, l.Usage)
			require.Equal(t, w.metric, l.Usage.Metric)
			require.Equal(t, w.quantity, l.Usage.Rated.Quantity.Text('f'))
			require.Equal(t, l.AmountCents, l.Usage.Rated.Amount)
		} else {
			require.Nil(t, l.Usage)
		}
		sum += l.AmountCents
	}
	require.Equal(t, c.AmountCents, sum, "a charge is the sum of its lines")
	require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.reconciliation WHERE charge_id = $1`, c.ID))
	return lines
}

func mustInt64(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	for _, r := range s {
		require.True(t, r >= '0' && r <= '9', "%q is not a whole number", s)
		n = n*10 + int64(r-'0')
	}
	return n
}

// closeNov closes acme's November and returns its charge.
func (b *testBundle) closeNov(ctx context.Context, t *testing.T) *ledger.Charge {
	t.Helper()
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	return c
}

// onTiered puts acme on plan tiered (planTiered), before its period opens.
func (b *testBundle) onTiered(ctx context.Context, t *testing.T) {
	t.Helper()
	_, _, err := b.putPlan(ctx, t, "tiered", planTiered)
	require.NoError(t, err)
	_, err = b.onPlan(ctx, "acme", ptr("tiered"))
	require.NoError(t, err)
}

// record records events for acme.
func (b *testBundle) record(ctx context.Context, t *testing.T, events ...ledger.UsageEventParams) {
	t.Helper()
	for _, e := range events {
		_, err := b.Ledger.UsageEventRecord(ctx, e)
		require.NoError(t, err, e.EventID)
	}
}

// The close rates each metric of the period's quantity events with the
// period's plan version, into a line each, beside the pre-priced events'
// line, and the charge is the sum of the lines.
func TestChargeLines(t *testing.T) {
	t.Parallel()

	t.Run("OnePerMetricAndPrePriced", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onTiered(ctx, t)
		b.record(ctx, t,
			quantityEvent("a1", "api_calls", "600"), quantityEvent("a2", "api_calls", "600.5"),
			quantityEvent("s1", "storage_gb", "150"),
			event("p1", 250), event("p2", 100))

		c := b.closeNov(ctx, t)
		require.Equal(t, ledger.ChargePending, c.Status)
		require.Equal(t, int64(5), c.EventCount)
		lines := requireLines(t, ctx, b, c, []lineWant{
			// 1000 at 0.5, then 200.5 at 0.1: 520.05, rounded once.
			{kind: ledger.ChargeLineUsage, metric: "api_calls", quantity: "1200.5", events: 2, exact: "520.05", amount: 520},
			// Two packages of 100 started, at 250.
			{kind: ledger.ChargeLineUsage, metric: "storage_gb", quantity: "150", events: 1, exact: "500", amount: 500},
			{kind: ledger.ChargeLinePrePriced, events: 2, amount: 350},
		})
		require.Equal(t, int64(1370), c.AmountCents)

		api := lines[0].Usage
		require.Equal(t, "tiered", api.PlanID)
		require.Equal(t, int32(1), api.PlanVersion)
		require.Len(t, api.Rated.Tiers, 2)
		require.Equal(t, "1000", api.Rated.Tiers[0].Quantity.Text('f'))
		require.Equal(t, "500", api.Rated.Tiers[0].Amount.Text('f'))
		require.Equal(t, "200.5", api.Rated.Tiers[1].Quantity.Text('f'))
		require.Equal(t, "20.05", api.Rated.Tiers[1].Amount.Text('f'))
		require.Equal(t, []int{0, 1}, []int{api.Rated.Tiers[0].Tier, api.Rated.Tiers[1].Tier}, "indexes in Go")
		require.Equal(t, "2", lines[1].Usage.Rated.Packages.Text('f'))
		require.Equal(t, int64(1), b.Count(t, `SELECT (tiers -> 0 ->> 'tier')::bigint FROM billing.charge_lines WHERE line = 1`),
			"numbers from 1 in SQL")

		// Finance's view names the charge's customer, period and status.
		require.Equal(t, int64(1020), b.Count(t, `
SELECT sum(amount_cents) FROM billing.charge_line_items
WHERE customer_id = 'acme' AND period = '2026-11' AND charge_status = 'pending' AND kind = 'usage' AND plan_version = 1`))
	})

	t.Run("EachLineRoundedOnce", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, _, err := b.putPlan(ctx, t, "halves",
			`{"currency":"usd","prices":{"a":{"model":"per_unit","unit_amount":"0.5"},"b":{"model":"per_unit","unit_amount":"0.5"}}}`)
		require.NoError(t, err)
		_, err = b.onPlan(ctx, "acme", ptr("halves"))
		require.NoError(t, err)
		b.record(ctx, t, quantityEvent("a", "a", "3"), quantityEvent("b", "b", "3"))
		c := b.closeNov(ctx, t)
		requireLines(t, ctx, b, c, []lineWant{
			{kind: ledger.ChargeLineUsage, metric: "a", quantity: "3", events: 1, exact: "1.5", amount: 2},
			{kind: ledger.ChargeLineUsage, metric: "b", quantity: "3", events: 1, exact: "1.5", amount: 2},
		})
		require.Equal(t, int64(4), c.AmountCents, "the sum of rounded lines, not the rounded sum (3)")
	})

	t.Run("MinimumAndZero", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, _, err := b.putPlan(ctx, t, "min",
			`{"currency":"usd","prices":{"a":{"model":"per_unit","unit_amount":"1","minimum_amount":"1000"},`+
				`"z":{"model":"per_unit","unit_amount":"1","minimum_amount":"1000"}}}`)
		require.NoError(t, err)
		_, err = b.onPlan(ctx, "acme", ptr("min"))
		require.NoError(t, err)
		b.record(ctx, t, quantityEvent("a", "a", "1"), quantityEvent("z", "z", "0"))
		c := b.closeNov(ctx, t)
		lines := requireLines(t, ctx, b, c, []lineWant{
			{kind: ledger.ChargeLineUsage, metric: "a", quantity: "1", events: 1, exact: "1000", amount: 1000},
			{kind: ledger.ChargeLineUsage, metric: "z", quantity: "0", events: 1, exact: "0", amount: 0},
		})
		require.True(t, lines[0].Usage.Rated.MinimumApplied)
		require.Equal(t, "1", lines[0].Usage.Rated.Subtotal.Text('f'))
		require.False(t, lines[1].Usage.Rated.MinimumApplied, "no usage owes no minimum")
	})

	t.Run("NothingOwedIsSkippedWithItsLines", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t)
		b.record(ctx, t, quantityEvent("z", "api_calls", "0"))
		c := b.closeNov(ctx, t)
		require.Equal(t, ledger.ChargeSkipped, c.Status)
		requireLines(t, ctx, b, c, []lineWant{
			{kind: ledger.ChargeLineUsage, metric: "api_calls", quantity: "0", events: 1, exact: "0", amount: 0}})
	})

	t.Run("WithThePlanVersionThePeriodOpenedWith", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t) // version 1: api_calls at 0.5
		b.record(ctx, t, quantityEvent("q1", "api_calls", "10"))
		_, created, err := b.putPlan(ctx, t, "std", planTiered) // version 2, from December
		require.NoError(t, err)
		require.True(t, created)
		b.record(ctx, t, quantityEvent("q2", "api_calls", "10"))
		c := b.closeNov(ctx, t)
		lines := requireLines(t, ctx, b, c, []lineWant{
			{kind: ledger.ChargeLineUsage, metric: "api_calls", quantity: "20", events: 2, exact: "10", amount: 10}})
		require.Equal(t, int32(1), lines[0].Usage.PlanVersion)
	})

	t.Run("AgainIsTheSameCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t)
		b.record(ctx, t, quantityEvent("q", "api_calls", "7"))
		first := b.closeNov(ctx, t)
		again := b.closeNov(ctx, t)
		require.Equal(t, first.ID, again.ID)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.charge_lines`), "lines are written once")
	})

	t.Run("AppendOnlyAndReconciled", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t)
		b.record(ctx, t, quantityEvent("q", "api_calls", "7"), event("p", 100))
		c := b.closeNov(ctx, t)
		requireLines(t, ctx, b, c, []lineWant{
			{kind: ledger.ChargeLineUsage, metric: "api_calls", quantity: "7", events: 1, exact: "3.5", amount: 4},
			{kind: ledger.ChargeLinePrePriced, events: 1, amount: 100},
		})
		_, err := b.Pool.Exec(ctx, `UPDATE billing.charge_lines SET amount_cents = 0 WHERE charge_id = $1`, c.ID)
		require.ErrorContains(t, err, "append-only")

		// A line that is not the events' (here: one the close never
		// wrote) shows in the reconciliation.
		_, err = b.Pool.Exec(ctx, `
INSERT INTO billing.charge_lines (charge_id, customer_id, line, kind, event_count, exact_amount, amount_cents, created_at)
VALUES ($1, $2, 3, 'carried', 0, 5, 5, now())`, c.ID, c.CustomerID)
		require.NoError(t, err)
		require.Equal(t, "ledger_differs_from_charge",
			b.text(t, `SELECT disagreement FROM billing.reconciliation WHERE charge_id = $1`, c.ID))
	})
}
