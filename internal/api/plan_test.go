package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// planVersionBody is a plan version as the API answers it.
type planVersionBody struct {
	PlanID    string          `json:"plan_id"`
	Version   int32           `json:"version"`
	Currency  string          `json:"currency"`
	Prices    json.RawMessage `json:"prices"`
	CreatedAt time.Time       `json:"created_at"`
	CreatedBy string          `json:"created_by"`
}

// Price books of the tests below, and the prices as the API answers them.
const (
	planPerUnit       = `{"currency":"usd","prices":{"api_calls":{"model":"per_unit","unit_amount":"0.5"}}}`
	planPerUnitPrices = `{"api_calls":{"model":"per_unit","unit_amount":"0.5"}}`
	planTiered        = `{"currency":"USD","prices":{"storage_gb":{"tiers":[{"unit_amount":"2.50","up_to":"100"},{"up_to":null,"unit_amount":"1","flat_amount":"0"}],"model":"graduated"}}}`
	planTieredPrices  = `{"storage_gb":{"model":"graduated","tiers":[{"up_to":"100","unit_amount":"2.5"},{"up_to":null,"unit_amount":"1"}]}}`
)

func TestPlanPut(t *testing.T) {
	t.Parallel()

	t.Run("AdminOnly", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		reader := b.apiKey(ctx, t, "reader", ledger.ScopeBillingRead)
		req := b.newRequest(http.MethodPut, "/v1/plans/std", planPerUnit)
		req.Header.Set("Authorization", "Bearer "+reader)
		requireProblem(t, b.serve(req), http.StatusForbidden, "forbidden")
		require.Equal(t, int64(0), b.Count(t, `SELECT count(*) FROM billing.plans`))
	})

	t.Run("BadPlanID", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, path := range []string{"/v1/plans/a%01b", "/v1/plans/" + strings.Repeat("p", 256)} {
			requireInvalid(t, b.do(http.MethodPut, path, planPerUnit), "plan_id")
		}
		require.Equal(t, int64(0), b.Count(t, `SELECT count(*) FROM billing.plans`))
	})

	t.Run("CreatesVersions", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.do(http.MethodPut, "/v1/plans/std", planPerUnit)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		v := decodeJSON[planVersionBody](t, rec)
		require.Equal(t, "std", v.PlanID)
		require.Equal(t, int32(1), v.Version)
		require.Equal(t, "usd", v.Currency)
		require.Equal(t, planPerUnitPrices, string(v.Prices))
		require.True(t, v.CreatedAt.Equal(ledgertest.ClockStart))
		require.Regexp(t, `^operator:all/\S+$`, v.CreatedBy)

		rec = b.do(http.MethodPut, "/v1/plans/std", planTiered)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		v = decodeJSON[planVersionBody](t, rec)
		require.Equal(t, int32(2), v.Version)
		require.Equal(t, planTieredPrices, string(v.Prices), "canonical: fields in order, no trailing zeros, no zero flat amount")
	})

	t.Run("CurrencyChange", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		require.Equal(t, http.StatusCreated, b.do(http.MethodPut, "/v1/plans/std", planPerUnit).Code)
		p := requireInvalid(t, b.do(http.MethodPut, "/v1/plans/std", `{"currency":"eur","prices":{}}`), "currency")
		require.Contains(t, p.Errors["currency"], "a new plan_id")
	})

	t.Run("InvalidFieldsByPath", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.do(http.MethodPut, "/v1/plans/std", `{"currency":"usd","prices":{"api_calls":{"model":"graduated",
			"tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":0.1}]},
			"storage_gb":{"model":"per_unit","unit_amount":"1","package_size":"10"}},"discount":1}`)
		p := requireInvalid(t, rec, "prices.api_calls.tiers[1].unit_amount")
		require.Contains(t, p.Errors["prices.api_calls.tiers[1].unit_amount"], `a decimal in a string, such as "0.1"`)
		require.Contains(t, p.Errors["prices.storage_gb.package_size"], "not used by the per_unit model")
		require.Contains(t, p.Errors["discount"], "not a known field")

		rec = b.do(http.MethodPut, "/v1/plans/std", `{"currency":"usd","prices":{"api_calls":{"model":"volume",
			"tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":"500","unit_amount":"0.1"},{"up_to":null,"unit_amount":"0"}]}}}`)
		p = requireInvalid(t, rec, "prices.api_calls.tiers[1].up_to")
		require.Contains(t, p.Errors["prices.api_calls.tiers[1].up_to"], "greater than the previous tier's up_to (1000)")
		require.Equal(t, int64(0), b.Count(t, `SELECT count(*) FROM billing.plans`))
	})

	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, body := range []string{`{"currency":`, `[]`, `"usd"`} {
			requireProblem(t, b.do(http.MethodPut, "/v1/plans/std", body), http.StatusBadRequest, "malformed_json")
		}
		req := b.newRequest(http.MethodPut, "/v1/plans/std", planPerUnit)
		req.Header.Set("Content-Type", "text/plain")
		requireProblem(t, b.serve(req), http.StatusUnsupportedMediaType, "unsupported_media_type")
	})

	t.Run("Replay", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		first := b.do(http.MethodPut, "/v1/plans/std", planTiered)
		require.Equal(t, http.StatusCreated, first.Code, "body: %s", first.Body)
		b.Clock.Advance(time.Minute)
		// The same content, spelled as the canonical form spells it.
		again := b.do(http.MethodPut, "/v1/plans/std", `{"currency":"usd","prices":`+planTieredPrices+`}`)
		require.Equal(t, http.StatusOK, again.Code, "body: %s", again.Body)
		require.JSONEq(t, first.Body.String(), again.Body.String(), "the version as first put")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.plan_versions`))
	})
}

func TestPlanGet(t *testing.T) {
	t.Parallel()
	_, b := setup(t, setupOpts{})
	b.Plan(t, "std", planPerUnit)
	b.Plan(t, "std", planTiered)

	type planBody struct {
		PlanID   string            `json:"plan_id"`
		Currency string            `json:"currency"`
		Versions []planVersionBody `json:"versions"`
	}
	rec := b.do(http.MethodGet, "/v1/plans/std", "")
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	p := decodeJSON[planBody](t, rec)
	require.Equal(t, "std", p.PlanID)
	require.Equal(t, "usd", p.Currency)
	require.Len(t, p.Versions, 2)
	require.Equal(t, int32(1), p.Versions[0].Version)
	require.Equal(t, planPerUnitPrices, string(p.Versions[0].Prices))
	require.Equal(t, int32(2), p.Versions[1].Version)
	require.Equal(t, planTieredPrices, string(p.Versions[1].Prices))
	require.Equal(t, "test", p.Versions[1].CreatedBy)

	for _, path := range []string{"/v1/plans/ghost", "/v1/plans/a%01b", "/v1/plans/" + strings.Repeat("p", 256)} {
		requireProblem(t, b.do(http.MethodGet, path, ""), http.StatusNotFound, "not_found")
	}
}

func TestPlanList(t *testing.T) {
	t.Parallel()
	_, b := setup(t, setupOpts{})
	type pageBody struct {
		Data       []planVersionBody `json:"data"`
		HasMore    bool              `json:"has_more"`
		NextCursor *string           `json:"next_cursor"`
	}
	page := decodeJSON[pageBody](t, b.do(http.MethodGet, "/v1/plans", ""))
	require.Empty(t, page.Data)
	require.NotNil(t, page.Data, "an empty page is [], not null")

	for _, id := range []string{"gold", "basic", "pro"} {
		b.Plan(t, id, planPerUnit)
	}
	b.Plan(t, "gold", planTiered)

	page = decodeJSON[pageBody](t, b.do(http.MethodGet, "/v1/plans?limit=2", ""))
	require.True(t, page.HasMore)
	require.Len(t, page.Data, 2)
	require.Equal(t, "basic", page.Data[0].PlanID)
	require.Equal(t, "gold", page.Data[1].PlanID)
	require.Equal(t, int32(2), page.Data[1].Version, "each plan at its latest version")
	require.Equal(t, "gold", *page.NextCursor)

	page = decodeJSON[pageBody](t, b.do(http.MethodGet, "/v1/plans?limit=2&starting_after=gold", ""))
	require.False(t, page.HasMore)
	require.Nil(t, page.NextCursor)
	require.Len(t, page.Data, 1)
	require.Equal(t, "pro", page.Data[0].PlanID)

	p := requireInvalid(t, b.do(http.MethodGet, "/v1/plans?limit=0&starting_after=%00", ""), "limit")
	require.Contains(t, p.Errors, "starting_after")
}
