package ledger_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// rollup runs usage roll-ups until they hold what was committed
// (ledgertest.Bundle.Rollup), and returns the thresholds they recorded.
func (b *testBundle) rollup(t *testing.T, ctx context.Context) int {
	t.Helper()
	return b.Rollup(t, ctx)
}

// requireRollupsMatchEvents requires the roll-ups to hold exactly what the
// events that count come to, bucket by bucket.
func (b *testBundle) requireRollupsMatchEvents(t *testing.T) {
	t.Helper()
	require.Zero(t, b.Count(t, `
WITH want AS (
    SELECT customer_id, period, CASE WHEN amount_cents IS NULL THEN metric ELSE '' END AS metric,
           date_trunc('hour', occurred_at, 'UTC') AS bucket_start, count(*) AS events,
           coalesce(sum(quantity) FILTER (WHERE amount_cents IS NULL), 0) AS quantity,
           coalesce(sum(amount_cents), 0) AS amount_cents
    FROM billing.usage_events_counted GROUP BY 1, 2, 3, 4
),
got AS (
    SELECT customer_id, period, metric, bucket_start, events, quantity, amount_cents
    FROM billing.usage_rollups WHERE events <> 0 OR quantity <> 0 OR amount_cents <> 0
)
SELECT count(*) FROM ((TABLE want EXCEPT TABLE got) UNION ALL (TABLE got EXCEPT TABLE want)) d`),
		"the roll-ups differ from the events")
}

func TestUsageRollup(t *testing.T) {
	t.Parallel()

	t.Run("EachEventAndVoidOnce", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onTiered(ctx, t)
		hourAgo := b.Clock.Now().Add(-time.Hour)
		early := quantityEvent("a0", "api_calls", "7.25")
		early.OccurredAt = &hourAgo
		b.record(ctx, t, early, quantityEvent("a1", "api_calls", "600"), quantityEvent("a2", "api_calls", "0.5"),
			quantityEvent("s1", "storage_gb", "150"), event("p1", 250), event("p2", 100))
		b.rollup(t, ctx)
		b.requireRollupsMatchEvents(t)
		require.Equal(t, int64(6), b.Count(t, `SELECT sum(events) FROM billing.usage_rollups`))
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.usage_rollups WHERE metric = 'api_calls'`),
			"an hour's bucket each")

		// Voids subtract; a metric voided whole comes to nothing.
		_, err := b.void(ctx, "s1", "sent twice")
		require.NoError(t, err)
		_, err = b.void(ctx, "p2", "wrong amount")
		require.NoError(t, err)
		b.record(ctx, t, quantityEvent("a3", "api_calls", "1"))
		b.rollup(t, ctx)
		b.requireRollupsMatchEvents(t)

		// Once each: more roll-ups add nothing.
		before := b.Count(t, `SELECT sum(events) FROM billing.usage_rollups`)
		b.rollup(t, ctx)
		b.rollup(t, ctx)
		require.Equal(t, before, b.Count(t, `SELECT sum(events) FROM billing.usage_rollups`))
		b.requireRollupsMatchEvents(t)
	})

	t.Run("ALaterCommitWaitsForAnEarlierID", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.record(ctx, t, event("e1", 1)) // opens the period
		b.rollup(t, ctx)

		// An ingest takes its id and stays open, as ingest does (the period's
		// row locked first); a later one commits.
		slow, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = slow.Rollback(ctx) }()
		_, err = slow.Exec(ctx, `SELECT 1 FROM billing.periods WHERE customer_id = 'acme' AND period = '2026-11' FOR KEY SHARE`)
		require.NoError(t, err)
		var slowID int64
		require.NoError(t, slow.QueryRow(ctx, `
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, occurred_at, received_at, payload_hash)
VALUES ('acme', 'slow', '2026-11', 1000, 'usd', $1, $1, sha256('slow')) RETURNING id`, b.Clock.Now()).Scan(&slowID))
		b.record(ctx, t, event("e2", 10))

		for range 3 {
			_, err := b.Ledger.UsageRollup(ctx)
			require.NoError(t, err)
		}
		require.Less(t, b.Count(t, `SELECT event_id FROM billing.usage_rollup_watermark`), slowID,
			"the watermark passed an id whose transaction is still open")
		require.Equal(t, int64(1), b.Count(t, `SELECT sum(amount_cents) FROM billing.usage_rollups`))

		require.NoError(t, slow.Commit(ctx))
		b.rollup(t, ctx)
		require.Equal(t, int64(1011), b.Count(t, `SELECT sum(amount_cents) FROM billing.usage_rollups`))
		b.requireRollupsMatchEvents(t)
	})

	t.Run("ABacklogInChunks", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.record(ctx, t, event("e1", 1))
		b.rollup(t, ctx)
		// Ids far apart: a backlog of more ids than one roll-up adds.
		_, err := b.Pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('billing.usage_events', 'id'),
			nextval(pg_get_serial_sequence('billing.usage_events', 'id')) + $1)`, int64(ledger.UsageRollupBatchMax)+5)
		require.NoError(t, err)
		b.record(ctx, t, event("e2", 10))
		_, err = b.void(ctx, "e1", "test")
		require.NoError(t, err)

		var chunks int
		for deadline := time.Now().Add(30 * time.Second); b.Count(t, `SELECT sum(amount_cents) FROM billing.usage_rollups`) != 10; {
			res, err := b.Ledger.UsageRollup(ctx)
			require.NoError(t, err)
			if res.More {
				chunks++
				require.Equal(t, int64(1), b.Count(t, `SELECT sum(amount_cents) FROM billing.usage_rollups`),
					"the void goes with the last chunk")
			}
			require.True(t, time.Now().Before(deadline))
			time.Sleep(10 * time.Millisecond)
		}
		require.Equal(t, 1, chunks)
		b.requireRollupsMatchEvents(t)
	})
}

// thresholds sets acme's usage alert thresholds.
func (b *testBundle) thresholds(t *testing.T, ctx context.Context, cents ...int64) {
	t.Helper()
	c, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd",
		UsageAlertThresholdsCents: cents, PlanID: b.planOf(t, ctx)})
	require.NoError(t, err)
	require.IsIncreasing(t, c.UsageAlertThresholdsCents)
}

// planOf is acme's plan, kept when its thresholds change.
func (b *testBundle) planOf(t *testing.T, ctx context.Context) *string {
	t.Helper()
	var plan *string
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT plan_id FROM billing.customers WHERE customer_id = 'acme'`).Scan(&plan))
	return plan
}

// reachedThresholds are the usage.threshold_reached notifications, by
// threshold.
func (b *testBundle) reachedThresholds(t *testing.T, ctx context.Context) []ledger.PublicThreshold {
	t.Helper()
	rows, err := b.Pool.Query(ctx, `SELECT body FROM billing.notifications WHERE type = 'usage.threshold_reached'
ORDER BY (body->'data'->'object'->>'threshold_cents')::bigint`)
	require.NoError(t, err)
	defer rows.Close()
	var got []ledger.PublicThreshold
	for rows.Next() {
		var raw []byte
		require.NoError(t, rows.Scan(&raw))
		var n ledger.NotificationBody
		require.NoError(t, json.Unmarshal(raw, &n))
		var th ledger.PublicThreshold
		require.NoError(t, json.Unmarshal(n.Data.Object, &th))
		got = append(got, th)
	}
	require.NoError(t, rows.Err())
	return got
}

func TestUsageThresholds(t *testing.T) {
	t.Parallel()

	t.Run("EachThresholdOnce", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.subscribe(t, ctx, ledger.NotifyUsageThreshold)
		b.thresholds(t, ctx, 1000, 500, 1000)

		b.record(ctx, t, event("e1", 300))
		require.Zero(t, b.rollup(t, ctx))
		b.record(ctx, t, event("e2", 300))
		require.Equal(t, 1, b.rollup(t, ctx), "600 reached 500")
		require.Zero(t, b.rollup(t, ctx), "once")
		b.record(ctx, t, event("e3", 500))
		require.Equal(t, 1, b.rollup(t, ctx), "1100 reached 1000")
		b.record(ctx, t, event("e4", 5))
		require.Zero(t, b.rollup(t, ctx), "every threshold reached")

		got := b.reachedThresholds(t, ctx)
		require.Len(t, got, 2)
		require.Equal(t, int64(500), got[0].ThresholdCents)
		require.Equal(t, int64(600), got[0].TotalCents)
		require.Equal(t, ledger.PublicThreshold{CustomerID: "acme", Period: "2026-11", ThresholdCents: 1000, TotalCents: 1100,
			Currency: "usd", ReachedAt: got[1].ReachedAt}, got[1])
	})

	t.Run("RatedQuantitiesCount", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.subscribe(t, ctx, ledger.NotifyUsageThreshold)
		b.onTiered(ctx, t)
		b.thresholds(t, ctx, 500, 700)

		// 1000 api_calls at 0.5 reach 500.
		b.record(ctx, t, quantityEvent("a1", "api_calls", "900"), quantityEvent("a2", "api_calls", "100"))
		require.Equal(t, 1, b.rollup(t, ctx))
		// A void takes 100 back; 150 more make 1050: 1000 at 0.5 and 50 at
		// 0.1, 505, and 100 pre-priced: 605.
		_, err := b.void(ctx, "a2", "sent twice")
		require.NoError(t, err)
		b.record(ctx, t, quantityEvent("a3", "api_calls", "150"), event("p1", 100))
		require.Zero(t, b.rollup(t, ctx), "605 is under 700")
		b.record(ctx, t, event("p2", 100))
		require.Equal(t, 1, b.rollup(t, ctx), "705 reached 700")

		got := b.reachedThresholds(t, ctx)
		require.Len(t, got, 2)
		require.Equal(t, int64(500), got[0].TotalCents)
		require.Equal(t, int64(705), got[1].TotalCents)
	})

	t.Run("ThresholdSetLateIsCheckedByTheNextEvent", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.record(ctx, t, event("e1", 900))
		require.Zero(t, b.rollup(t, ctx), "no threshold yet")
		b.thresholds(t, ctx, 800)
		require.Zero(t, b.rollup(t, ctx), "no new event: nothing read")
		b.record(ctx, t, event("e2", 1))
		require.Equal(t, 1, b.rollup(t, ctx))
		require.Equal(t, int64(901), b.Count(t, `SELECT total_cents FROM billing.usage_thresholds_reached`))
	})

	t.Run("TheCloseChecksTheRatedTotal", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onTiered(ctx, t)
		b.record(ctx, t, event("e1", 100), quantityEvent("a1", "api_calls", "1600"))
		b.thresholds(t, ctx, 600, 2000)
		b.closeNov(ctx, t) // no roll-up ran: the close tells it
		// 1000 at 0.5 and 600 at 0.1, and 100 pre-priced.
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.usage_thresholds_reached WHERE threshold_cents = 600 AND total_cents = 660`))
		require.Zero(t, b.rollup(t, ctx), "a closed period is the close's")
	})
}
