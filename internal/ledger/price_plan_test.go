package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
)

// Price books of the tests below.
const (
	planAPICalls = `{"currency":"usd","prices":{"api_calls":{"model":"per_unit","unit_amount":"0.5"}}}`
	planTiered   = `{"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1"}]},"storage_gb":{"model":"package","package_size":"100","unit_amount":"250"}}}`
)

// parsePlan decodes a price book as PUT /v1/plans/{plan_id} takes it.
func parsePlan(t *testing.T, priceBook string) pricing.Plan {
	t.Helper()
	plan, err := pricing.ParsePlan([]byte(priceBook))
	require.NoError(t, err)
	return plan
}

// putPlan puts priceBook as plan id.
func (b *testBundle) putPlan(ctx context.Context, t *testing.T, id, priceBook string) (*ledger.PlanVersion, bool, error) {
	t.Helper()
	return b.Ledger.PlanPut(ctx, ledger.PlanPutParams{PlanID: id, Plan: parsePlan(t, priceBook), Actor: "operator:ops/tly_1"})
}

func TestPlanPut(t *testing.T) {
	t.Parallel()

	t.Run("AppendOnly", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, _, err := b.putPlan(ctx, t, "std", planTiered)
		require.NoError(t, err)
		for _, stmt := range []string{
			`UPDATE billing.plans SET currency = 'eur'`,
			`DELETE FROM billing.plans`,
			`UPDATE billing.plan_versions SET price_book = '{"currency":"usd","prices":{}}'`,
			`DELETE FROM billing.plan_versions`,
			`UPDATE billing.plan_prices SET model = 'volume'`,
			`DELETE FROM billing.plan_prices`,
			`TRUNCATE billing.plan_prices CASCADE`, // (charge_lines refers to it)
		} {
			_, err := b.Pool.Exec(ctx, stmt)
			require.ErrorContains(t, err, "append-only", stmt)
		}
	})

	t.Run("ConcurrentPutsSerialize", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		const n = 8
		var wg sync.WaitGroup
		errs := make(chan error, 2*n)
		for i := range n {
			for range 2 { // each content twice: one of the two is a replay
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _, err := b.putPlan(ctx, t, "std", fmt.Sprintf(`{"currency":"usd","prices":{"m%d":{"model":"per_unit","unit_amount":"1"}}}`, i))
					errs <- err
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		versions, err := b.Ledger.PlanGet(ctx, "std")
		require.NoError(t, err)
		// Two puts of one content make one version when nothing came between
		// them, two when another content did: between n and 2n versions,
		// numbered 1, 2, … without a gap, never two alike in a row.
		require.GreaterOrEqual(t, len(versions), n)
		for i, v := range versions {
			require.Equal(t, int32(i+1), v.Version)
			if i > 0 {
				require.NotEqual(t, string(versions[i-1].PriceBook), string(v.PriceBook), "versions %d and %d", i, i+1)
			}
		}
	})

	t.Run("CurrencyIsThePlans", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, _, err := b.putPlan(ctx, t, "std", planAPICalls)
		require.NoError(t, err)
		_, _, err = b.putPlan(ctx, t, "std", `{"currency":"eur","prices":{}}`)
		requireRefused(t, err, "currency", `must be "usd", the currency of plan std`)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.plan_versions`))
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, _, err := b.putPlan(ctx, t, "bad\x00id", planAPICalls)
		requireRefused(t, err, "plan_id", "control characters")
		_, _, err = b.Ledger.PlanPut(ctx, ledger.PlanPutParams{PlanID: "std", Actor: "test",
			Plan: pricing.Plan{Currency: "usd", Prices: map[string]pricing.Price{"api_calls": {Model: "flat"}}}})
		var pe *pricing.ValidationError
		require.ErrorAs(t, err, &pe)
		require.Contains(t, pe.Fields, "prices.api_calls.model")
		require.Equal(t, int64(0), b.Count(t, `SELECT count(*) FROM billing.plans`))
	})

	t.Run("NewContentIsANewVersion", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		first, created, err := b.putPlan(ctx, t, "std", planAPICalls)
		require.NoError(t, err)
		require.True(t, created)
		second, created, err := b.putPlan(ctx, t, "std", planTiered)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, int32(2), second.Version)
		// The first content again is a third version (only the latest is
		// compared), not a replay of the first.
		third, created, err := b.putPlan(ctx, t, "std", planAPICalls)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, int32(3), third.Version)

		versions, err := b.Ledger.PlanGet(ctx, "std")
		require.NoError(t, err)
		require.Len(t, versions, 3)
		require.Equal(t, first, versions[0], "a version as answered when put and as stored")
		require.Equal(t, second, versions[1])
		require.Equal(t, third, versions[2])
	})

	t.Run("PricesByMetric", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, _, err := b.putPlan(ctx, t, "std", planAPICalls)
		require.NoError(t, err)
		v, _, err := b.putPlan(ctx, t, "std", planTiered)
		require.NoError(t, err)
		rows, err := b.Pool.Query(ctx, `SELECT metric, model, price::text FROM billing.plan_prices WHERE plan_id = 'std' AND version = $1 ORDER BY metric`, v.Version)
		require.NoError(t, err)
		var got []string
		for rows.Next() {
			var metric, model, price string
			require.NoError(t, rows.Scan(&metric, &model, &price))
			got = append(got, metric+" "+model+" "+price)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{
			`api_calls graduated {"model": "graduated", "tiers": [{"up_to": "1000", "unit_amount": "0.5"}, {"up_to": null, "unit_amount": "0.1"}]}`,
			`storage_gb package {"model": "package", "unit_amount": "250", "package_size": "100"}`,
		}, got)
	})

	t.Run("Replay", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		first, created, err := b.putPlan(ctx, t, "std", planAPICalls)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, int32(1), first.Version)
		require.Equal(t, "operator:ops/tly_1", first.CreatedBy)
		require.Equal(t, planAPICalls, string(first.PriceBook))

		// The same content, spelled otherwise, by someone else.
		b.Clock.Advance(1)
		replay, created, err := b.Ledger.PlanPut(ctx, ledger.PlanPutParams{PlanID: "std", Actor: "cli:alice",
			Plan: parsePlan(t, `{"prices":{"api_calls":{"unit_amount":"0.50","model":"per_unit"}},"currency":"USD"}`)})
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, first, replay, "the version as first put")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.plan_versions`))
	})
}

func TestPlanGet(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	for _, id := range []string{"ghost", "bad\x00id", ""} {
		_, err := b.Ledger.PlanGet(ctx, id)
		require.ErrorIs(t, err, ledger.ErrNotFound, "%q", id)
	}
}

func TestPlanList(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	plans, more, err := b.Ledger.PlanList(ctx, ledger.PlanListParams{})
	require.NoError(t, err)
	require.Empty(t, plans)
	require.False(t, more)

	for _, id := range []string{"b", "a", "c", "B"} {
		_, _, err := b.putPlan(ctx, t, id, planAPICalls)
		require.NoError(t, err)
	}
	_, _, err = b.putPlan(ctx, t, "a", planTiered)
	require.NoError(t, err)

	ids := func(plans []*ledger.PlanVersion) []string {
		var out []string
		for _, p := range plans {
			out = append(out, fmt.Sprintf("%s/%d", p.PlanID, p.Version))
		}
		return out
	}
	plans, more, err = b.Ledger.PlanList(ctx, ledger.PlanListParams{Limit: 2})
	require.NoError(t, err)
	require.True(t, more)
	require.Equal(t, []string{"B/1", "a/2"}, ids(plans), "byte order, each plan at its latest version")
	plans, more, err = b.Ledger.PlanList(ctx, ledger.PlanListParams{Limit: 2, StartingAfter: "a"})
	require.NoError(t, err)
	require.False(t, more)
	require.Equal(t, []string{"b/1", "c/1"}, ids(plans))

	_, _, err = b.Ledger.PlanList(ctx, ledger.PlanListParams{Limit: ledger.PlanListLimitMax + 1, StartingAfter: "x\x00"})
	requireRefused(t, err, "limit", "between 1 and 500")
	requireRefused(t, err, "starting_after", "control characters")
}
