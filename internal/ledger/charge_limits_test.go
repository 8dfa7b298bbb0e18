package ledger_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestChargeLimits(t *testing.T) {
	t.Parallel()

	t.Run("AboveMaximumIsHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{})
		c := closedWith(t, ctx, b, "acme", ledger.AmountMaxCents+1)
		cl, got := claim(t, ctx, b, c)
		require.Nil(t, cl)
		require.Equal(t, ledger.ChargeHeld, got.Status)
		require.Equal(t, ledger.HeldAmountTooLarge, *got.HeldReason)

		act := ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:ops/tly_1", Reason: "checked"}
		_, err := b.Ledger.ChargeApprove(ctx, act)
		var ce *ledger.ConflictError
		require.ErrorAs(t, err, &ce)
		require.Contains(t, ce.Detail, "cancel it")
		canceled, err := b.Ledger.ChargeCancel(ctx, act)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeCanceled, canceled.Status)
	})

	t.Run("BelowMinimumIsCarriedIntoTheNextCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := guardBundle(t, ledger.Config{PeriodBudgetCents: 10_000})
		nov := closedWith(t, ctx, b, "acme", 30)
		cl, got := claim(t, ctx, b, nov)
		require.Nil(t, cl, "nothing to call")
		require.Equal(t, ledger.ChargeCarriedForward, got.Status)
		require.Nil(t, got.CarriedInto)
		require.False(t, got.BudgetReserved)
		require.Zero(t, spend(t, ctx, b))
		require.Equal(t, int64(30), b.Count(t, `SELECT carried_cents FROM billing.customer_carried_forward WHERE customer_id = 'acme'`))
		cust, err := b.Ledger.CustomerGet(ctx, "acme")
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"usd": 30}, cust.CarriedForwardCents)

		// December: the customer's next charge bills November's 30 too.
		b.Clock.Set(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))
		_, err = b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "dec-1", AmountCents: 100})
		require.NoError(t, err)
		dec, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-12", Actor: "job:2/1"})
		require.NoError(t, err)
		require.Equal(t, int64(130), dec.AmountCents)
		require.Equal(t, int64(30), dec.CarriedInCents)
		require.Equal(t, int64(1), dec.EventCount, "its own events")
		requireLines(t, ctx, b, dec, []lineWant{
			{kind: ledger.ChargeLinePrePriced, events: 1, amount: 100}, {kind: ledger.ChargeLineCarried, amount: 30}})
		got, err = b.Ledger.ChargeGet(ctx, nov.ID)
		require.NoError(t, err)
		require.Equal(t, dec.ID, *got.CarriedInto)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.customer_carried_forward`))

		// Every acknowledged cent is in exactly one charge that was or will be attempted.
		require.Equal(t, b.Count(t, `SELECT sum(amount_cents) FROM billing.usage_events WHERE customer_id = 'acme'`),
			b.Count(t, `SELECT sum(amount_cents - carried_in_cents) FROM billing.charges WHERE customer_id = 'acme'`))
		require.Equal(t, b.Count(t, `SELECT sum(amount_cents) FROM billing.usage_events WHERE customer_id = 'acme'`),
			b.Count(t, `SELECT sum(amount_cents) FROM billing.charges WHERE customer_id = 'acme' AND status <> 'carried_forward'`))
		cl, _ = claim(t, ctx, b, dec)
		require.NotNil(t, cl, "130 is sent")
		s, err := b.Ledger.PeriodSpendGet(ctx, "2026-12", "usd")
		require.NoError(t, err)
		require.Equal(t, int64(130), s.ReservedCents)
	})

	t.Run("MinimumsFollowStripesTable", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, int64(50), ledger.AmountMinCents("usd"))
		require.Equal(t, int64(30), ledger.AmountMinCents("gbp"))
		require.Equal(t, int64(50), ledger.AmountMinCents("jpy"))
		require.Equal(t, int64(50), ledger.AmountMinCents("xyz"), "an unknown currency: the smallest, never carried by mistake")
	})
}
