package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// onPlan puts customer id (usd) on plan, nil for none.
func (b *testBundle) onPlan(ctx context.Context, id string, plan *string) (*ledger.Customer, error) {
	c, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: id, StripeCustomerID: "cus_" + id, Currency: "usd", PlanID: plan})
	return c, err
}

// periodPlan returns the plan and version period of acme records.
func (b *testBundle) periodPlan(ctx context.Context, t *testing.T, period string) (*string, *int32) {
	t.Helper()
	p, err := b.Ledger.PeriodGet(ctx, "acme", period)
	require.NoError(t, err)
	return p.PlanID, p.PlanVersion
}

func TestCustomerPlan(t *testing.T) {
	t.Parallel()

	t.Run("MustExistInTheCustomersCurrency", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.onPlan(ctx, "acme", ptr("ghost"))
		requireRefused(t, err, "plan_id", `unknown plan "ghost"`)
		_, _, err = b.putPlan(ctx, t, "euro", `{"currency":"eur","prices":{}}`)
		require.NoError(t, err)
		_, err = b.onPlan(ctx, "acme", ptr("euro"))
		requireRefused(t, err, "plan_id", `plan "euro" is in eur, and the customer in usd`)
		_, err = b.onPlan(ctx, "acme", ptr("bad\x00"))
		requireRefused(t, err, "plan_id", "control characters")

		// A currency change that would leave the plan's behind.
		_, _, err = b.putPlan(ctx, t, "std", planAPICalls)
		require.NoError(t, err)
		c, err := b.onPlan(ctx, "acme", ptr("std"))
		require.NoError(t, err)
		require.Equal(t, "std", *c.PlanID)
		_, _, err = b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "eur", PlanID: ptr("std")})
		requireRefused(t, err, "plan_id", `plan "std" is in usd, and the customer in eur`)
		got, err := b.Ledger.CustomerGet(ctx, "acme")
		require.NoError(t, err)
		require.Equal(t, "usd", got.Currency)
		require.Equal(t, "std", *got.PlanID)
	})

	t.Run("PeriodKeepsTheVersionItOpenedWith", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("before", 100))
		require.NoError(t, err)
		planID, version := b.periodPlan(ctx, t, "2026-11")
		require.Nil(t, planID, "a period opened before its customer had a plan has none")
		require.Nil(t, version)

		_, _, err = b.putPlan(ctx, t, "std", planAPICalls)
		require.NoError(t, err)
		_, err = b.onPlan(ctx, "acme", ptr("std"))
		require.NoError(t, err)
		_, err = b.Ledger.UsageEventRecord(ctx, event("during", 100))
		require.NoError(t, err)
		planID, _ = b.periodPlan(ctx, t, "2026-11")
		require.Nil(t, planID, "the open period keeps what it opened with")

		// December opens with version 1; a second version later does not
		// change it, and January opens with it (in a batch, as it may).
		b.Clock.Set(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC))
		_, err = b.Ledger.UsageEventRecord(ctx, event("december", 100))
		require.NoError(t, err)
		_, _, err = b.putPlan(ctx, t, "std", planTiered)
		require.NoError(t, err)
		_, err = b.Ledger.UsageEventRecord(ctx, event("december-2", 100))
		require.NoError(t, err)
		planID, version = b.periodPlan(ctx, t, "2026-12")
		require.Equal(t, "std", *planID)
		require.Equal(t, int32(1), *version)

		b.Clock.Set(time.Date(2027, 1, 3, 0, 0, 0, 0, time.UTC))
		_, err = b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{event("january", 100)})
		require.NoError(t, err)
		planID, version = b.periodPlan(ctx, t, "2027-01")
		require.Equal(t, "std", *planID)
		require.Equal(t, int32(2), *version)

		// Off the plan: the next period has none, January keeps its own.
		_, err = b.onPlan(ctx, "acme", nil)
		require.NoError(t, err)
		planID, _ = b.periodPlan(ctx, t, "2027-01")
		require.Equal(t, "std", *planID)
		b.Clock.Set(time.Date(2027, 2, 3, 0, 0, 0, 0, time.UTC))
		_, err = b.Ledger.UsageEventRecord(ctx, event("february", 100))
		require.NoError(t, err)
		planID, _ = b.periodPlan(ctx, t, "2027-02")
		require.Nil(t, planID)

		// Nothing rewrites a period's plan, not even by hand.
		_, err = b.Pool.Exec(ctx, `UPDATE billing.periods SET plan_version = 2 WHERE customer_id = 'acme' AND period = '2026-12'`)
		require.ErrorContains(t, err, "cannot change")
		_, err = b.Pool.Exec(ctx, `UPDATE billing.periods SET plan_id = NULL, plan_version = NULL WHERE customer_id = 'acme' AND period = '2026-12'`)
		require.ErrorContains(t, err, "cannot change")
	})
}

func ptr[T any](v T) *T { return &v }
