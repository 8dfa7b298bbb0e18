package ledger_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// quantityEvent is a quantity event of acme.
func quantityEvent(id, metric, quantity string) ledger.UsageEventParams {
	return ledger.UsageEventParams{CustomerID: "acme", EventID: id, Metric: metric, Quantity: quantity}
}

// onStd puts acme on plan std (planAPICalls: api_calls is priced).
func (b *testBundle) onStd(ctx context.Context, t *testing.T) {
	t.Helper()
	_, _, err := b.putPlan(ctx, t, "std", planAPICalls)
	require.NoError(t, err)
	_, err = b.onPlan(ctx, "acme", ptr("std"))
	require.NoError(t, err)
}

// requireUnpriced requires err to refuse metric as unpriced, its detail
// containing want.
func requireUnpriced(t *testing.T, err error, metric, want string) {
	t.Helper()
	var ue *ledger.UnpricedMetricError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, metric, ue.Metric)
	require.Contains(t, ue.Detail, want)
}

func TestUsageEventQuantity(t *testing.T) {
	t.Parallel()

	t.Run("AmountOrQuantity", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t)
		both := quantityEvent("e", "api_calls", "1")
		both.AmountCents = 100
		for _, tc := range []struct {
			fields []string
			params ledger.UsageEventParams
		}{
			{[]string{"amount_cents", "quantity"}, both},
			{[]string{"amount_cents"}, ledger.UsageEventParams{CustomerID: "acme", EventID: "e", Metric: "api_calls"}},
			{[]string{"metric"}, quantityEvent("e", "", "1")},
			{[]string{"quantity"}, quantityEvent("e", "api_calls", "0.0000000000001")},
			{[]string{"quantity"}, quantityEvent("e", "api_calls", "-1")},
			{[]string{"quantity"}, quantityEvent("e", "api_calls", "1e21")},
			{[]string{"quantity"}, quantityEvent("e", "api_calls", "twelve")},
		} {
			_, err := b.Ledger.UsageEventRecord(ctx, tc.params)
			for _, field := range tc.fields {
				requireInvalid(t, err, field)
			}
			_, err = b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{event("ok", 1), tc.params})
			var be *ledger.BatchError
			require.ErrorAs(t, err, &be)
			requireInvalid(t, be.Items[1], tc.fields[0])
		}
		require.Zero(t, b.eventCount(t))
	})

	t.Run("CloseRatesThem", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t)
		_, err := b.Ledger.UsageEventRecord(ctx, event("priced", 250))
		require.NoError(t, err)
		_, err = b.Ledger.UsageEventRecord(ctx, quantityEvent("q", "api_calls", "1000"))
		require.NoError(t, err)
		p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
		require.NoError(t, err)
		require.Equal(t, int64(2), p.EventCount)
		require.Equal(t, int64(250), p.TotalCents)
		c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
		require.NoError(t, err)
		require.Equal(t, int64(250+500), c.AmountCents, "250 as sent, and 1000 api_calls at 0.5")
		require.Equal(t, int64(2), c.EventCount)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.reconciliation`))
	})

	t.Run("Records", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t)
		for _, tc := range []struct{ id, sent, stored string }{
			{"first", "12.50", "12.5"}, // the period's first event, on the batch path
			{"whole", "1e3", "1000"},   // then the one-statement path
			{"tiny", "0.000000000001", "0.000000000001"},
			{"zero", "0", "0"},
		} {
			res, err := b.Ledger.UsageEventRecord(ctx, quantityEvent(tc.id, "api_calls", tc.sent))
			require.NoError(t, err, tc.id)
			require.False(t, res.Replay)
			require.Equal(t, tc.stored, res.Event.Quantity.Text('f'), tc.id)
			require.Zero(t, res.Event.AmountCents)
			require.Equal(t, "api_calls", *res.Event.Metric)
			require.Equal(t, tc.stored, b.text(t, `SELECT quantity::text FROM billing.usage_events WHERE event_id = $1`, tc.id))
		}
		require.Equal(t, int64(4), b.Count(t, `SELECT count(*) FROM billing.usage_events WHERE amount_cents IS NULL`))
	})

	t.Run("Replays", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t)
		first, err := b.Ledger.UsageEventRecord(ctx, quantityEvent("q", "api_calls", "12.5"))
		require.NoError(t, err)
		for _, same := range []string{"12.5", "12.50", "1.25e1"} {
			res, err := b.Ledger.UsageEventRecord(ctx, quantityEvent("q", "api_calls", same))
			require.NoError(t, err, same)
			require.True(t, res.Replay, same)
			require.Equal(t, first.Event, res.Event, "a replay answers the event as first stored")
			results, err := b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{quantityEvent("q", "api_calls", same)})
			require.NoError(t, err, same)
			require.True(t, results[0].Replay)
		}
		for _, other := range []ledger.UsageEventParams{
			quantityEvent("q", "api_calls", "12.6"),
			quantityEvent("q", "storage_gb", "12.5"),
			event("q", 1250),
		} {
			_, err := b.Ledger.UsageEventRecord(ctx, other)
			requireConflict(t, err, ledger.ConflictIdempotency)
			_, err = b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{other})
			var be *ledger.BatchError
			require.ErrorAs(t, err, &be)
			requireConflict(t, be.Items[0], ledger.ConflictIdempotency)
		}
	})

	t.Run("Unpriced", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		// A period that opened before its customer had a plan has none.
		_, err := b.Ledger.UsageEventRecord(ctx, event("priced", 100))
		require.NoError(t, err)
		b.onStd(ctx, t)
		_, err = b.Ledger.UsageEventRecord(ctx, quantityEvent("q1", "api_calls", "1"))
		requireUnpriced(t, err, "api_calls", `period 2026-11 of customer acme has no plan`)
		requireUnpriced(t, err, "api_calls", "Send this event with amount_cents")

		// A period on a plan that does not price the metric (a new version
		// pricing it applies from the next period only).
		b.Clock.Set(b.Clock.Now().AddDate(0, 1, 0))
		_, err = b.Ledger.UsageEventRecord(ctx, quantityEvent("q2", "api_calls", "1"))
		require.NoError(t, err, "december is on version 1, which prices api_calls")
		_, err = b.Ledger.UsageEventRecord(ctx, quantityEvent("q3", "storage_gb", "1"))
		requireUnpriced(t, err, "storage_gb", `metric "storage_gb" has no price in version 1 of plan std, which prices period 2026-12 of customer acme`)
		requireUnpriced(t, err, "storage_gb", "put a price for it in plan std (PUT /v1/plans/std)")
		_, _, err = b.putPlan(ctx, t, "std", planTiered)
		require.NoError(t, err)
		_, err = b.Ledger.UsageEventRecord(ctx, quantityEvent("q3", "storage_gb", "1"))
		requireUnpriced(t, err, "storage_gb", "version 1 of plan std")

		// In a batch, the item is refused and nothing of the batch written.
		_, err = b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{
			quantityEvent("q4", "api_calls", "2"), quantityEvent("q5", "storage_gb", "1"), event("p", 100)})
		var be *ledger.BatchError
		require.ErrorAs(t, err, &be)
		require.Len(t, be.Items, 1)
		requireUnpriced(t, be.Items[1], "storage_gb", "version 1 of plan std")
		require.Equal(t, int64(2), b.eventCount(t), "the first event and q2")
	})
}

// text returns the single text that query returns.
func (b *testBundle) text(t *testing.T, query string, args ...any) string {
	t.Helper()
	var s string
	require.NoError(t, b.Pool.QueryRow(context.Background(), query, args...).Scan(&s))
	return s
}
