package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// void voids event id of acme.
func (b *testBundle) void(ctx context.Context, id, reason string) (*ledger.UsageEventVoidResult, error) {
	return b.Ledger.UsageEventVoid(ctx, ledger.UsageEventVoidParams{CustomerID: "acme", EventID: id, Reason: reason,
		Actor: "operator:ops/tly_1"})
}

func TestUsageEventVoid(t *testing.T) {
	t.Parallel()

	t.Run("NettedOutOfTheClose", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t)
		b.record(ctx, t, event("p1", 250), event("p2", 100), quantityEvent("q1", "api_calls", "10"),
			quantityEvent("q2", "api_calls", "4"))
		res, err := b.void(ctx, "p2", "sent twice")
		require.NoError(t, err)
		require.False(t, res.Replay)
		require.Equal(t, "2026-11", res.Void.Period)
		require.Equal(t, "operator:ops/tly_1", res.Void.VoidedBy)
		require.Equal(t, int64(100), res.Void.Event.AmountCents, "the event as it was recorded")
		_, err = b.void(ctx, "q2", "a test event")
		require.NoError(t, err)

		p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
		require.NoError(t, err)
		require.Equal(t, int64(2), p.EventCount)
		require.Equal(t, int64(250), p.TotalCents)

		c := b.closeNov(ctx, t)
		require.Equal(t, int64(2), c.EventCount)
		requireLines(t, ctx, b, c, []lineWant{
			{kind: ledger.ChargeLineUsage, metric: "api_calls", quantity: "10", events: 1, exact: "5", amount: 5},
			{kind: ledger.ChargeLinePrePriced, events: 1, amount: 250},
		})
		require.Equal(t, int64(4), b.eventCount(t), "the voided events stay")
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.usage_events_counted`))
		require.Equal(t, int64(250), b.Count(t, `SELECT total_cents FROM billing.period_totals WHERE customer_id = 'acme'`))
	})

	t.Run("TwiceIsAReplay", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.record(ctx, t, event("p1", 250))
		first, err := b.void(ctx, "p1", "sent twice")
		require.NoError(t, err)
		again, err := b.void(ctx, "p1", "another reason")
		require.NoError(t, err)
		require.True(t, again.Replay)
		require.Equal(t, first.Void, again.Void, "the first void, reason and all")

		// Still a replay once the period is closed.
		b.closeNov(ctx, t)
		again, err = b.void(ctx, "p1", "sent twice")
		require.NoError(t, err)
		require.True(t, again.Replay)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.usage_event_voids`))
	})

	t.Run("RefusedOnceClosed", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.record(ctx, t, event("p1", 250), event("p2", 100))
		c := b.closeNov(ctx, t)
		_, err := b.void(ctx, "p1", "wrong amount")
		requireConflict(t, err, ledger.ConflictPeriodClosed)
		require.ErrorContains(t, err, fmt.Sprintf("its events are what charge %d bills", c.ID))
		require.ErrorContains(t, err, "refund the event's amount")

		// Past its close time, not closed yet: refused too.
		ctx, b = setup(t, setupOpts{})
		b.record(ctx, t, event("p1", 250))
		p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
		require.NoError(t, err)
		b.Clock.Set(p.ClosesAt)
		_, err = b.void(ctx, "p1", "wrong amount")
		requireConflict(t, err, ledger.ConflictPeriodClosed)
		require.ErrorContains(t, err, "is being closed and charged")
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.usage_event_voids`))
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.record(ctx, t, event("p1", 250))
		_, err := b.void(ctx, "nope", "x")
		require.ErrorIs(t, err, ledger.ErrNotFound)
		require.ErrorContains(t, err, `event "nope" of customer "acme" not found`)
		_, err = b.void(ctx, "p1", "")
		requireInvalid(t, err, "reason")
		_, err = b.Ledger.UsageEventVoid(ctx, ledger.UsageEventVoidParams{EventID: "p1", Reason: "x", Actor: "a"})
		requireInvalid(t, err, "customer_id")
		_, err = b.void(ctx, "p1", string(make([]byte, 501)))
		requireInvalid(t, err, "reason")
	})

	t.Run("AppendOnly", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.record(ctx, t, event("p1", 250))
		_, err := b.void(ctx, "p1", "sent twice")
		require.NoError(t, err)
		for _, stmt := range []string{
			`DELETE FROM billing.usage_event_voids`,
			`UPDATE billing.usage_event_voids SET reason = 'x'`,
			`TRUNCATE billing.usage_event_voids`,
		} {
			_, err := b.Pool.Exec(ctx, stmt)
			require.ErrorContains(t, err, "append-only", stmt)
		}
	})

	// A void racing the close either commits first, and the charge leaves
	// the event out, or is refused: never voided and billed, never refused
	// and left out.
	t.Run("RacesTheClose", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{noCustomer: true})
		var voided, refused int
		for i := range 12 {
			id := fmt.Sprintf("c%d", i)
			b.Customer(t, id)
			_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: id, EventID: "keep", AmountCents: 1000})
			require.NoError(t, err)
			_, err = b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: id, EventID: "wrong", AmountCents: 1})
			require.NoError(t, err)

			var wg sync.WaitGroup
			var voidErr error
			var c *ledger.Charge
			wg.Add(2)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					time.Sleep(time.Millisecond)
				}
				_, voidErr = b.Ledger.UsageEventVoid(ctx, ledger.UsageEventVoidParams{CustomerID: id, EventID: "wrong",
					Reason: "race", Actor: "operator:ops/tly_1"})
			}()
			go func() {
				defer wg.Done()
				var err error
				c, err = b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: id, Period: "2026-11", Actor: "job:1/1"})
				require.NoError(t, err)
			}()
			wg.Wait()
			if voidErr == nil {
				voided++
				require.Equal(t, int64(1000), c.AmountCents, id)
			} else {
				refused++
				requireConflict(t, voidErr, ledger.ConflictPeriodClosed)
				require.Equal(t, int64(1001), c.AmountCents, id)
			}
		}
		t.Logf("%d voids before the close, %d refused after it", voided, refused)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.reconciliation`))
	})
}
