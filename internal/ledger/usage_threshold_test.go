package ledger_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// thresholds sets acme's usage alert thresholds.
func (b *testBundle) thresholds(t *testing.T, ctx context.Context, cents ...int64) {
	t.Helper()
	c, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd",
		UsageAlertThresholdsCents: cents})
	require.NoError(t, err)
	require.IsIncreasing(t, c.UsageAlertThresholdsCents)
}

func (b *testBundle) scan(t *testing.T, ctx context.Context) int {
	t.Helper()
	n, err := b.Ledger.UsageThresholdScan(ctx, time.Minute)
	require.NoError(t, err)
	return n
}

func TestUsageThresholdScan(t *testing.T) {
	t.Parallel()

	t.Run("EachThresholdOnce", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.subscribe(t, ctx, ledger.NotifyUsageThreshold)
		b.thresholds(t, ctx, 1000, 500, 1000)
		record := func(id string, amount int64) {
			_, err := b.Ledger.UsageEventRecord(ctx, event(id, amount))
			require.NoError(t, err)
		}

		record("e1", 300)
		require.Zero(t, b.scan(t, ctx))
		record("e2", 300)
		require.Equal(t, 1, b.scan(t, ctx), "600 reached 500")
		require.Zero(t, b.scan(t, ctx), "once")
		record("e3", 500)
		require.Equal(t, 1, b.scan(t, ctx), "1100 reached 1000")
		record("e4", 5)
		require.Zero(t, b.scan(t, ctx), "every threshold reached")

		rows, err := b.Pool.Query(ctx, `SELECT body FROM billing.notifications WHERE type = 'usage.threshold_reached' ORDER BY body->'data'->'object'->>'threshold_cents'`)
		require.NoError(t, err)
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
		require.Len(t, got, 2)
		require.Equal(t, ledger.PublicThreshold{CustomerID: "acme", Period: "2026-11", ThresholdCents: 1000, TotalCents: 1100,
			Currency: "usd", ReachedAt: got[0].ReachedAt}, got[0])
		require.Equal(t, int64(500), got[1].ThresholdCents)
		require.Equal(t, int64(600), got[1].TotalCents)
	})

	t.Run("IngestCommittedLateIsRead", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.thresholds(t, ctx, 500)
		b.Customer(t, "beta")
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 1)) // opens acme's period
		require.NoError(t, err)
		b.Clock.Advance(2 * time.Minute)
		require.Zero(t, b.scan(t, ctx)) // the watermark passes e1

		// An ingest of acme takes its id, then beta's, later, commits and is
		// read first; acme's commits after that scan.
		slow, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = slow.Rollback(ctx) }()
		_, err = slow.Exec(ctx, `
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, occurred_at, received_at, payload_hash)
VALUES ('acme', 'slow', '2026-11', 1000, 'usd', $1, $1, sha256('slow'))`, b.Clock.Now())
		require.NoError(t, err)
		_, err = b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "beta", EventID: "b1", AmountCents: 1})
		require.NoError(t, err)
		require.Zero(t, b.scan(t, ctx))
		require.NoError(t, slow.Commit(ctx))

		b.Clock.Advance(2 * time.Minute)
		require.Equal(t, 1, b.scan(t, ctx), "acme's 1001 reached 500")
	})

	t.Run("ThresholdSetLateIsCheckedByTheNextEvent", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 900))
		require.NoError(t, err)
		require.Zero(t, b.scan(t, ctx), "no threshold yet")
		b.Clock.Advance(2 * time.Minute) // e1 settles: the watermark passes it
		require.Zero(t, b.scan(t, ctx))
		b.thresholds(t, ctx, 800)
		require.Zero(t, b.scan(t, ctx), "no new event: nothing read")
		_, err = b.Ledger.UsageEventRecord(ctx, event("e2", 1))
		require.NoError(t, err)
		require.Equal(t, 1, b.scan(t, ctx))
		require.Equal(t, int64(901), b.Count(t, `SELECT total_cents FROM billing.usage_thresholds_reached`))
	})

	t.Run("TheCloseChecksTheFinalTotal", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 900))
		require.NoError(t, err)
		b.thresholds(t, ctx, 800, 2000)
		b.close(t, ctx) // no scan ran: the close tells it
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.usage_thresholds_reached WHERE threshold_cents = 800 AND total_cents = 900`))
		require.Zero(t, b.scan(t, ctx))
	})

	t.Run("WatermarkWaitsForEventsToSettle", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.thresholds(t, ctx, 10_000)
		watermark := func() int64 { return b.Count(t, `SELECT last_event_id FROM billing.usage_threshold_scan`) }
		start := watermark()
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 1))
		require.NoError(t, err)
		b.scan(t, ctx)
		// An event younger than the settle time may have company from an
		// ingest still in flight with a lower id: read it again next time.
		require.Equal(t, start, watermark())
		b.Clock.Advance(time.Minute + time.Second)
		b.scan(t, ctx)
		require.Equal(t, b.Count(t, `SELECT max(id) FROM billing.usage_events`), watermark())
	})
}
