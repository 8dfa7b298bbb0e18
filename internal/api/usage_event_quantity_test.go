package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// quantityEventBody is what a quantity event's answer says of its amount
// and quantity: JSON as written, so a quantity is compared exactly.
type quantityEventBody struct {
	AmountCents json.RawMessage `json:"amount_cents"`
	Quantity    json.RawMessage `json:"quantity"`
	Metric      *string         `json:"metric"`
}

// onPlan puts acme on plan std, which prices api_calls, before its
// period opens.
func (b *testBundle) onPlan(t *testing.T) {
	t.Helper()
	b.Plan(t, "std", planPerUnit)
	rec := b.do(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd","plan_id":"std"}`)
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
}

func TestUsageEventQuantity(t *testing.T) {
	t.Parallel()

	t.Run("AmountAndQuantity", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		b.onPlan(t)
		p := requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":100,"metric":"api_calls","quantity":3}`), "quantity")
		require.Contains(t, p.Errors["amount_cents"], "not both")
		require.Contains(t, p.Errors["quantity"], "not both")
	})

	t.Run("Batch", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		b.onPlan(t)
		rec := b.postBatch(batchJSON(eventJSON("p", 100),
			`{"customer_id":"acme","event_id":"q","metric":"api_calls","quantity":"7.25"}`))
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		var resp struct {
			Data []struct {
				Event quantityEventBody `json:"event"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
		require.Equal(t, "100", string(resp.Data[0].Event.AmountCents))
		require.Equal(t, "null", string(resp.Data[0].Event.Quantity))
		require.Equal(t, "null", string(resp.Data[1].Event.AmountCents))
		require.Equal(t, "7.25", string(resp.Data[1].Event.Quantity))

		rec = b.postBatch(batchJSON(eventJSON("p2", 100),
			`{"customer_id":"acme","event_id":"q2","metric":"storage_gb","quantity":1}`))
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "batch_rejected")
		require.Len(t, p.Items, 1)
		require.Equal(t, 1, p.Items[0].Index)
		require.Equal(t, http.StatusUnprocessableEntity, p.Items[0].Status)
		require.Equal(t, "unpriced_metric", p.Items[0].Code)
		require.Contains(t, p.Items[0].Detail, `metric "storage_gb" has no price in version 1 of plan std`)
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.usage_events`))
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		b.onPlan(t)
		for body, field := range map[string]string{
			`{"customer_id":"acme","event_id":"e1","metric":"api_calls","quantity":true}`:                   "quantity",
			`{"customer_id":"acme","event_id":"e1","metric":"api_calls","quantity":{"n":1}}`:                "quantity",
			`{"customer_id":"acme","event_id":"e1","metric":"api_calls","quantity":"1,5"}`:                  "quantity",
			`{"customer_id":"acme","event_id":"e1","metric":"api_calls","quantity":-2}`:                     "quantity",
			`{"customer_id":"acme","event_id":"e1","metric":"api_calls","quantity":0.0000000000001}`:        "quantity",
			`{"customer_id":"acme","event_id":"e1","metric":"api_calls","quantity":1e1000000}`:              "quantity",
			`{"customer_id":"acme","event_id":"e1","quantity":1}`:                                           "metric",
			`{"customer_id":"acme","event_id":"e1","amount_cents":0,"metric":"api_calls"}`:                  "amount_cents",
			`{"customer_id":"acme","event_id":"e1","amount_cents":null,"metric":"api_calls","quantity":""}`: "amount_cents",
		} {
			requireInvalid(t, b.requireEventRejected(t, body), field)
		}
	})

	t.Run("Records", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		b.onPlan(t)
		for _, tc := range []struct{ id, sent, answered string }{
			{"number", `12.5`, `12.5`},
			{"string", `"0.000000000001"`, `0.000000000001`},
			{"exponent", `1e3`, `1000`},
			{"beyond a float64", `"12345678901234567.123456789012"`, `12345678901234567.123456789012`},
		} {
			rec := b.postEvent(`{"customer_id":"acme","event_id":"` + tc.id + `","metric":"api_calls","quantity":` + tc.sent + `}`)
			require.Equal(t, http.StatusCreated, rec.Code, "%s: %s", tc.id, rec.Body)
			ev := decodeJSON[quantityEventBody](t, rec)
			require.Equal(t, "null", string(ev.AmountCents), tc.id)
			require.Equal(t, tc.answered, string(ev.Quantity), tc.id)
			require.Equal(t, "api_calls", *ev.Metric)
		}

		// The same quantity spelled otherwise is a replay; another is a
		// conflict.
		rec := b.postEvent(`{"customer_id":"acme","event_id":"number","metric":"api_calls","quantity":"12.50"}`)
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Equal(t, "true", rec.Header().Get("Idempotent-Replayed"))
		require.Equal(t, "12.5", string(decodeJSON[quantityEventBody](t, rec).Quantity))
		requireProblem(t, b.postEvent(`{"customer_id":"acme","event_id":"number","metric":"api_calls","quantity":12.6}`),
			http.StatusConflict, "idempotency_conflict")
	})

	t.Run("Unpriced", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","metric":"api_calls","quantity":1}`)
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "unpriced_metric")
		require.Contains(t, p.Detail, `metric "api_calls" has no price: period 2026-11 of customer acme has no plan`)
		require.Contains(t, p.Detail, "Send this event with amount_cents")
	})
}
