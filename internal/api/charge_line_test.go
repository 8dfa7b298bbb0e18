package api_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// GET /v1/charges/{id} says what a charge is made of: its lines, adding up
// to its amount, each usage line with its rating.
func TestChargeLineItems(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	b.Plan(t, "std", `{"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[`+
		`{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1","flat_amount":"10"}]},`+
		`"storage_gb":{"model":"package","package_size":"100","unit_amount":"250","minimum_amount":"600"}}}`)
	rec := b.do(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd","plan_id":"std"}`)
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	for _, body := range []string{
		`{"customer_id":"acme","event_id":"a","metric":"api_calls","quantity":1200.5}`,
		`{"customer_id":"acme","event_id":"s","metric":"storage_gb","quantity":"150"}`,
		`{"customer_id":"acme","event_id":"p","amount_cents":99}`,
	} {
		rec := b.do(http.MethodPost, "/v1/usage-events", body)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
	}
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	require.Equal(t, int64(530+600+99), c.AmountCents)

	rec = b.do(http.MethodGet, fmt.Sprintf("/v1/charges/%d", c.ID), "")
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	got := decodeJSON[struct {
		AmountCents int64            `json:"amount_cents"`
		LineItems   []map[string]any `json:"line_items"`
	}](t, rec)
	require.Equal(t, c.AmountCents, got.AmountCents)
	require.Equal(t, []map[string]any{
		{"line": 1.0, "kind": "usage", "metric": "api_calls", "plan_id": "std", "plan_version": 1.0, "model": "graduated",
			"quantity": "1200.5", "event_count": 1.0, "subtotal": "530.05", "minimum_applied": false,
			"exact_amount": "530.05", "amount_cents": 530.0, "tiers": []any{
				map[string]any{"tier": 1.0, "quantity": "1000", "unit_amount": "0.5", "flat_amount": "0", "amount": "500"},
				map[string]any{"tier": 2.0, "quantity": "200.5", "unit_amount": "0.1", "flat_amount": "10", "amount": "30.05"},
			}},
		{"line": 2.0, "kind": "usage", "metric": "storage_gb", "plan_id": "std", "plan_version": 1.0, "model": "package",
			"quantity": "150", "event_count": 1.0, "packages": "2", "subtotal": "500", "minimum_applied": true,
			"exact_amount": "600", "amount_cents": 600.0},
		{"line": 3.0, "kind": "pre_priced", "event_count": 1.0, "exact_amount": "99", "amount_cents": 99.0},
	}, got.LineItems)
}
