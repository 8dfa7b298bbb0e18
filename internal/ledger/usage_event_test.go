package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

func event(id string, amount int64) ledger.UsageEventParams {
	return ledger.UsageEventParams{CustomerID: "acme", EventID: id, AmountCents: amount, Metric: "api_calls"}
}

func (b *testBundle) eventCount(t *testing.T) int64 {
	return b.Count(t, "SELECT count(*) FROM billing.usage_events")
}

func (b *testBundle) jobCount(t *testing.T) int64 {
	return b.Count(t, "SELECT count(*) FROM river.river_job WHERE kind = 'charge_period'")
}

func (b *testBundle) periodCount(t *testing.T) int64 {
	return b.Count(t, "SELECT count(*) FROM billing.periods")
}

func requireConflict(t *testing.T, err error, code string) {
	t.Helper()
	var ce *ledger.ConflictError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, code, ce.Code)
}

func requireInvalid(t *testing.T, err error, field string) {
	t.Helper()
	var ve *ledger.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Contains(t, ve.Fields, field, "fields: %v", ve.Fields)
}

func TestUsageEventRecord(t *testing.T) {
	t.Parallel()

	t.Run("AppendOnlyTrigger", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)

		for _, stmt := range []string{
			"UPDATE billing.usage_events SET amount_cents = 1",
			"DELETE FROM billing.usage_events",
			"TRUNCATE billing.usage_events CASCADE",
		} {
			_, err := b.Pool.Exec(ctx, stmt)
			require.ErrorContains(t, err, "append-only", stmt)
		}
		require.Equal(t, int64(1), b.eventCount(t))
	})

	t.Run("ConcurrentFirstEventsCreateOnePeriodAndOneJob", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		const n = 50
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := b.Ledger.UsageEventRecord(ctx, event(fmt.Sprintf("e%d", i), 10))
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, int64(n), b.eventCount(t))
		require.Equal(t, int64(1), b.periodCount(t))
		require.Equal(t, int64(1), b.jobCount(t))

		p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
		require.NoError(t, err)
		require.Equal(t, int64(n*10), p.TotalCents)
		require.Equal(t, int64(n), p.EventCount)
		require.NotNil(t, p.ChargeJobID)
		require.Equal(t, *p.ChargeJobID, b.Count(t, "SELECT id FROM river.river_job WHERE kind = 'charge_period'"))
	})

	t.Run("ConcurrentReplaysStoreOneRowAndAnswerAlike", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		const n = 20
		results := make([]*ledger.UsageEventResult, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := b.Ledger.UsageEventRecord(ctx, event("same", 250))
				require.NoError(t, err)
				results[i] = res
			}()
		}
		wg.Wait()
		require.Equal(t, int64(1), b.eventCount(t))
		created := 0
		for _, r := range results {
			if !r.Replay {
				created++
			}
			require.Equal(t, results[0].Event, r.Event)
		}
		require.Equal(t, 1, created)
	})

	t.Run("CreatesPeriodAndChargeJobScheduledAtClose", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		res, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		require.False(t, res.Replay)
		require.Equal(t, "2026-11", res.Event.Period)
		require.Equal(t, "usd", res.Event.Currency)
		require.Equal(t, ledgertest.ClockStart, res.Event.OccurredAt)

		var args []byte
		var scheduledAt time.Time
		var queue string
		require.NoError(t, b.Pool.QueryRow(ctx, `
SELECT args, scheduled_at, queue FROM river.river_job WHERE kind = 'charge_period'`).Scan(&args, &scheduledAt, &queue))
		require.JSONEq(t, `{"customer_id":"acme","period":"2026-11"}`, string(args))
		require.Equal(t, time.Date(2026, 12, 1, 1, 0, 0, 0, time.UTC), scheduledAt.UTC())
		require.Equal(t, "charges", queue)

		// A second event of the same period inserts no job.
		_, err = b.Ledger.UsageEventRecord(ctx, event("e2", 100))
		require.NoError(t, err)
		require.Equal(t, int64(1), b.jobCount(t))
	})

	t.Run("CurrencyMustMatchPeriod", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		ev := event("e1", 100)
		ev.Currency = "EUR"
		_, err := b.Ledger.UsageEventRecord(ctx, ev)
		requireInvalid(t, err, "currency")
		require.Zero(t, b.eventCount(t))

		// The period keeps the currency it started with when the customer changes.
		_, err = b.Ledger.UsageEventRecord(ctx, event("e2", 100))
		require.NoError(t, err)
		_, _, err = b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "eur"})
		require.NoError(t, err)
		_, err = b.Ledger.UsageEventRecord(ctx, ev)
		requireInvalid(t, err, "currency")
		ev.Currency = "usd"
		_, err = b.Ledger.UsageEventRecord(ctx, ev)
		require.NoError(t, err)
	})

	t.Run("IdempotencyConflict", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		_, err = b.Ledger.UsageEventRecord(ctx, event("e1", 101))
		requireConflict(t, err, ledger.ConflictIdempotency)
		require.Equal(t, int64(1), b.eventCount(t))
	})

	t.Run("InvalidInputWritesNothing", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		future := ledgertest.ClockStart.Add(6 * time.Minute)
		cases := []struct {
			field  string
			mutate func(p *ledger.UsageEventParams)
		}{
			{"amount_cents", func(p *ledger.UsageEventParams) { p.AmountCents = 0 }},
			{"amount_cents", func(p *ledger.UsageEventParams) { p.AmountCents = -5 }},
			{"amount_cents", func(p *ledger.UsageEventParams) { p.AmountCents = ledger.AmountCentsMax + 1 }},
			{"currency", func(p *ledger.UsageEventParams) { p.Currency = "dollars" }},
			{"customer_id", func(p *ledger.UsageEventParams) { p.CustomerID = "" }},
			{"customer_id", func(p *ledger.UsageEventParams) { p.CustomerID = "nobody" }},
			{"event_id", func(p *ledger.UsageEventParams) { p.EventID = "" }},
			{"event_id", func(p *ledger.UsageEventParams) { p.EventID = strings.Repeat("x", 256) }},
			{"event_id", func(p *ledger.UsageEventParams) { p.EventID = "a\nb" }},
			{"event_id", func(p *ledger.UsageEventParams) { p.EventID = "a\xffb" }},
			{"metric", func(p *ledger.UsageEventParams) { p.Metric = "m\x00" }},
			{"occurred_at", func(p *ledger.UsageEventParams) { p.OccurredAt = &future }},
			{"properties", func(p *ledger.UsageEventParams) { p.Properties = json.RawMessage(`[1,2]`) }},
			{"quantity", func(p *ledger.UsageEventParams) { p.AmountCents, p.Quantity = 0, "-1" }},
		}
		for _, tc := range cases {
			ev := event("bad", 100)
			tc.mutate(&ev)
			_, err := b.Ledger.UsageEventRecord(ctx, ev)
			requireInvalid(t, err, tc.field)
		}
		require.Zero(t, b.eventCount(t))
		require.Zero(t, b.periodCount(t))
		require.Zero(t, b.jobCount(t))
	})

	t.Run("PeriodClosed", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `UPDATE billing.periods SET status = 'closed', closed_at = now()`)
		require.NoError(t, err)

		_, err = b.Ledger.UsageEventRecord(ctx, event("e2", 100))
		requireConflict(t, err, ledger.ConflictPeriodClosed)

		// A replay of an acknowledged event still answers as a replay, and
		// a different payload under its id as a conflict, alone or in a batch.
		res, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		require.True(t, res.Replay)
		_, err = b.Ledger.UsageEventRecord(ctx, event("e1", 999))
		requireConflict(t, err, ledger.ConflictIdempotency)
		results, err := b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{event("e1", 100), event("e1", 100)})
		require.NoError(t, err)
		require.True(t, results[0].Replay)
		require.True(t, results[1].Replay)
		_, err = b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{event("e1", 100), event("e3", 100), event("e1", 5)})
		var be *ledger.BatchError
		require.ErrorAs(t, err, &be)
		require.Len(t, be.Items, 2)
		requireConflict(t, be.Items[1], ledger.ConflictPeriodClosed)
		requireConflict(t, be.Items[2], ledger.ConflictIdempotency)
		require.Equal(t, int64(1), b.eventCount(t))
	})

	t.Run("PeriodClosedSaysWhenAndWhatToDo", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		detail := func(t *testing.T, p ledger.UsageEventParams) string {
			t.Helper()
			_, err := b.Ledger.UsageEventRecord(ctx, p)
			var ce *ledger.ConflictError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, ledger.ConflictPeriodClosed, ce.Code)
			now := b.Clock.Now().UTC().Format(time.RFC3339)
			require.Contains(t, ce.Detail, "post the event again with an occurred_at in a period still open, such as now ("+now+
				"), or without occurred_at (it defaults to now): that period's charge counts it")
			return ce.Detail
		}
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)

		// November is open past its close time (2026-12-01T01:00Z): its
		// charge job has not run yet.
		b.Clock.Set(time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC))
		nov := time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)
		late := event("late", 100)
		late.OccurredAt = &nov
		require.Contains(t, detail(t, late), "period 2026-11 of customer acme stopped taking events at its close time, "+
			"2026-12-01T01:00:00Z, and is being closed and charged; events for it can no longer be added.")

		// Closed at 02:30, an hour and a half after its close time: the
		// message names when it was closed.
		b.Clock.Set(time.Date(2026, 12, 1, 2, 30, 0, 0, time.UTC))
		_, err = b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
		require.NoError(t, err)
		b.Clock.Set(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))
		d := detail(t, late)
		require.Contains(t, d, "period 2026-11 of customer acme was closed at 2026-12-01T02:30:00Z and its charge is computed")
		require.NotContains(t, d, "01:00:00Z", "not its scheduled close time")

		// October was never opened, and its close time passed.
		oct := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
		late.OccurredAt = &oct
		require.Contains(t, detail(t, late), "period 2026-10 of customer acme stopped taking events at 2026-11-01T01:00:00Z "+
			"(its end plus the close grace); it has no events and no charge")
	})

	t.Run("PeriodPastCloseTimeIsNotCreated", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		// October closed at 2026-11-01T01:00Z (end + 1 h grace).
		old := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
		ev := event("late", 100)
		ev.OccurredAt = &old
		_, err := b.Ledger.UsageEventRecord(ctx, ev)
		requireConflict(t, err, ledger.ConflictPeriodClosed)
		require.Zero(t, b.periodCount(t))
		require.Zero(t, b.jobCount(t))

		// Within the grace period a late event is still taken.
		b.Clock.Set(time.Date(2026, 12, 1, 0, 30, 0, 0, time.UTC))
		nov := time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)
		ev = event("grace", 100)
		ev.OccurredAt = &nov
		res, err := b.Ledger.UsageEventRecord(ctx, ev)
		require.NoError(t, err)
		require.Equal(t, "2026-11", res.Event.Period)
	})

	t.Run("ReplayReturnsStoredEvent", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		ev := event("e1", 100)
		ev.Properties = json.RawMessage(`{"b":1,"a":{"z":true,"y":[1,2]}}`)
		first, err := b.Ledger.UsageEventRecord(ctx, ev)
		require.NoError(t, err)
		require.False(t, first.Replay)

		// Same payload with keys reordered and the clock moved on: a replay.
		b.Clock.Advance(time.Minute)
		ev.Properties = json.RawMessage(`{"a":{"y":[1,2],"z":true},"b":1}`)
		again, err := b.Ledger.UsageEventRecord(ctx, ev)
		require.NoError(t, err)
		require.True(t, again.Replay)
		require.Equal(t, first.Event, again.Event)
		require.Equal(t, int64(1), b.eventCount(t))
	})

	t.Run("RolledBackIngestLeavesNeitherEventNorJob", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		failing := &failingScheduler{}
		l, err := ledger.New(b.Pool, ledger.Config{Clock: b.Clock.Now, Scheduler: failing})
		require.NoError(t, err)
		_, err = l.UsageEventRecord(ctx, event("e1", 100))
		require.ErrorIs(t, err, errSchedulerAfterInsert)
		require.True(t, failing.inserted, "the job was inserted before the failure")
		require.Zero(t, b.eventCount(t))
		require.Zero(t, b.periodCount(t))
		require.Zero(t, b.jobCount(t))
	})

	t.Run("UnknownCustomer", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		ev := event("e1", 100)
		ev.CustomerID = "ghost"
		_, err := b.Ledger.UsageEventRecord(ctx, ev)
		requireInvalid(t, err, "customer_id")
		require.Zero(t, b.periodCount(t))
	})
}

var errSchedulerAfterInsert = errors.New("scheduler failed after inserting the job")

// failingScheduler inserts the real job in the caller's transaction and then
// fails, as a crash between the job insert and the commit would.
type failingScheduler struct {
	ledger.Scheduler
	inserted bool
}

func (s *failingScheduler) ChargeJobInsertTx(ctx context.Context, tx pgx.Tx, customerID, period string, runAt time.Time) (int64, error) {
	var n int64
	if err := tx.QueryRow(ctx, `
INSERT INTO river.river_job (args, kind, max_attempts, queue, state, scheduled_at)
VALUES ($1, 'charge_period', 25, 'charges', 'scheduled', $2) RETURNING id`,
		fmt.Sprintf(`{"customer_id":%q,"period":%q}`, customerID, period), runAt).Scan(&n); err != nil {
		return 0, err
	}
	s.inserted = true
	return 0, errSchedulerAfterInsert
}

func TestUsageEventRecordBatch(t *testing.T) {
	t.Parallel()

	t.Run("AllOrNothing", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("taken", 5))
		require.NoError(t, err)
		b.Customer(t, "beta")
		other := event("b1", 10)
		other.CustomerID = "beta"

		_, err = b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{
			event("new1", 10), other, event("taken", 6), event("new2", 0),
		})
		var be *ledger.BatchError
		require.ErrorAs(t, err, &be)
		require.Len(t, be.Items, 2)
		requireConflict(t, be.Items[2], ledger.ConflictIdempotency)
		requireInvalid(t, be.Items[3], "amount_cents")

		// Nothing was written either way.
		_, err = b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{event("new1", 10), other, event("taken", 6)})
		require.ErrorAs(t, err, &be)
		require.Len(t, be.Items, 1)
		requireConflict(t, be.Items[2], ledger.ConflictIdempotency)
		require.Equal(t, int64(1), b.eventCount(t))
		require.Equal(t, int64(1), b.periodCount(t), "beta's period rolled back")
		require.Equal(t, int64(1), b.jobCount(t), "beta's job rolled back")
	})

	t.Run("ConcurrentOverlappingBatchesDoNotDeadlock", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		for _, c := range []string{"c1", "c2", "c3", "c4"} {
			b.Customer(t, c)
		}
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var batch []ledger.UsageEventParams
				for i := range 40 {
					// Each worker walks customers and events in a different order.
					c := []string{"c1", "c2", "c3", "c4"}[(i+w)%4]
					ev := event(fmt.Sprintf("ev-%d", (i*7+w*13)%40), 3)
					ev.CustomerID = c
					batch = append(batch, ev)
				}
				_, err := b.Ledger.UsageEventRecordBatch(ctx, batch)
				var be *ledger.BatchError
				if errors.As(err, &be) {
					// In-batch duplicates with another customer mapping are fine to conflict.
					return
				}
				require.NoError(t, err)
			}()
		}
		wg.Wait()
		require.Equal(t, int64(4), b.periodCount(t))
		require.Equal(t, int64(4), b.jobCount(t))
	})

	t.Run("StoredEventInBatchIsReplayed", func(t *testing.T) {
		// The batch is first inserted as if every event were new; the
		// stored one makes that fail, and the batch is recorded again with
		// the insert that skips it: nothing of the first try remains.
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		stored, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		res, err := b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{event("e0", 50), event("e1", 100), event("e2", 70)})
		require.NoError(t, err)
		require.False(t, res[0].Replay)
		require.True(t, res[1].Replay)
		require.Equal(t, stored.Event.ID, res[1].Event.ID)
		require.False(t, res[2].Replay)
		require.Equal(t, int64(3), b.eventCount(t))
		require.Equal(t, int64(220), b.Count(t, "SELECT sum(amount_cents) FROM billing.usage_events"))
	})

	t.Run("DuplicatesInsideBatchAreReplays", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		res, err := b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{
			event("x", 10), event("y", 20), event("x", 10),
		})
		require.NoError(t, err)
		require.False(t, res[0].Replay)
		require.False(t, res[1].Replay)
		require.True(t, res[2].Replay)
		require.Equal(t, res[0].Event, res[2].Event)
		require.Equal(t, int64(2), b.eventCount(t))

		_, err = b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{event("z", 10), event("z", 11)})
		var be *ledger.BatchError
		require.ErrorAs(t, err, &be)
		requireConflict(t, be.Items[1], ledger.ConflictIdempotency)
	})

	t.Run("SizeLimits", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecordBatch(ctx, nil)
		requireInvalid(t, err, "events")
		_, err = b.Ledger.UsageEventRecordBatch(ctx, make([]ledger.UsageEventParams, ledger.UsageEventBatchMax+1))
		requireInvalid(t, err, "events")
	})
}
