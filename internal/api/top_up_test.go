package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// topUpBody is a top-up as the API answers it.
type topUpBody struct {
	TopUpID     string  `json:"top_up_id"`
	Source      string  `json:"source"`
	Status      string  `json:"status"`
	AmountCents int64   `json:"amount_cents"`
	Currency    string  `json:"currency"`
	Category    string  `json:"category"`
	GrantID     *string `json:"grant_id"`
}

func TestTopUps(t *testing.T) {
	t.Parallel()

	t.Run("CreateReplayConflictListCancel", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		body := `{"top_up_id":"tu-1","amount_cents":5000,"grant_expires_at":"2027-06-01T00:00:00Z"}`
		rec := b.do(http.MethodPost, "/v1/customers/acme/top-ups", body)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		tu := decodeJSON[topUpBody](t, rec)
		require.Equal(t, topUpBody{TopUpID: "tu-1", Source: "api", Status: "pending", AmountCents: 5000, Currency: "usd",
			Category: "paid"}, tu)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'top_up'`),
			"its job was committed with it")

		rec = b.do(http.MethodPost, "/v1/customers/acme/top-ups", body)
		require.Equal(t, http.StatusOK, rec.Code, "a replay: body: %s", rec.Body)
		requireProblem(t, b.do(http.MethodPost, "/v1/customers/acme/top-ups", `{"top_up_id":"tu-1","amount_cents":6000}`),
			http.StatusConflict, "top_up_id_reused")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.top_ups`))

		rec = b.do(http.MethodPost, "/v1/customers/acme/top-ups", `{"top_up_id":"tu-2","amount_cents":7000}`)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		rec = b.do(http.MethodGet, "/v1/customers/acme/top-ups?limit=1", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		page := decodeJSON[struct {
			Data       []topUpBody `json:"data"`
			HasMore    bool        `json:"has_more"`
			NextCursor *string     `json:"next_cursor"`
		}](t, rec)
		require.Len(t, page.Data, 1)
		require.Equal(t, "tu-2", page.Data[0].TopUpID, "newest first")
		require.True(t, page.HasMore)
		rec = b.do(http.MethodGet, "/v1/customers/acme/top-ups?starting_after="+*page.NextCursor, "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Contains(t, rec.Body.String(), `"tu-1"`)

		rec = b.do(http.MethodGet, "/v1/customers/acme/top-ups/tu-1", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		requireProblem(t, b.do(http.MethodGet, "/v1/customers/acme/top-ups/nope", ""), http.StatusNotFound, "not_found")

		// Never sent to Stripe (no worker here): cancelable.
		rec = b.do(http.MethodPost, "/v1/customers/acme/top-ups/tu-1/cancel", `{"reason":"bought by mistake"}`)
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Equal(t, "canceled", decodeJSON[topUpBody](t, rec).Status)
		rec = b.do(http.MethodPost, "/v1/customers/acme/top-ups/tu-1/cancel", `{"reason":"again"}`)
		require.Equal(t, http.StatusOK, rec.Code, "canceling twice is a no-op: body: %s", rec.Body)

		// Sent to Stripe: money may be moving.
		_, err := b.Pool.Exec(t.Context(), `UPDATE billing.top_ups SET status = 'unknown', first_attempted_at = now()
WHERE top_up_id = 'tu-2'`)
		require.NoError(t, err)
		requireProblem(t, b.do(http.MethodPost, "/v1/customers/acme/top-ups/tu-2/cancel", `{"reason":"no"}`),
			http.StatusConflict, "top_up_not_cancelable")
	})

	t.Run("BadInputNamesTheField", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for body, field := range map[string]string{
			`{"top_up_id":"tu","amount_cents":20}`:                                             "amount_cents",
			`{"top_up_id":"tu","amount_cents":100000000}`:                                      "amount_cents",
			`{"top_up_id":"tu","amount_cents":5000,"currency":"eur"}`:                          "currency",
			`{"top_up_id":"","amount_cents":5000}`:                                             "top_up_id",
			`{"top_up_id":"` + strings.Repeat("x", 250) + `","amount_cents":5000}`:             "top_up_id",
			`{"top_up_id":"tu","amount_cents":5000,"category":"gift"}`:                         "category",
			`{"top_up_id":"recharge-1","amount_cents":5000}`:                                   "top_up_id",
			`{"top_up_id":"tu","amount_cents":5000,"grant_expires_at":"2020-01-01T00:00:00Z"}`: "grant_expires_at",
		} {
			rec := b.do(http.MethodPost, "/v1/customers/acme/top-ups", body)
			p := requireProblem(t, rec, http.StatusUnprocessableEntity, "validation_error")
			require.Contains(t, p.Errors, field, "body %s", body)
		}
		requireProblem(t, b.do(http.MethodPost, "/v1/customers/nobody/top-ups", `{"top_up_id":"tu","amount_cents":5000}`),
			http.StatusNotFound, "not_found")
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.top_ups`))
		p := requireProblem(t, b.do(http.MethodPost, "/v1/customers/acme/credit-grants",
			`{"grant_id":"top_up:x","amount_cents":100,"currency":"usd","category":"paid"}`), http.StatusUnprocessableEntity, "validation_error")
		require.Contains(t, p.Errors, "grant_id", "grant ids of top-ups are reserved")
	})

	t.Run("RechargeSettings", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.do(http.MethodPut, "/v1/customers/acme",
			`{"stripe_customer_id":"cus_acme","currency":"usd","recharge_below_cents":500,"recharge_to_cents":2000}`)
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Contains(t, rec.Body.String(), `"recharge_below_cents":500`)
		p := requireProblem(t, b.do(http.MethodPut, "/v1/customers/acme",
			`{"stripe_customer_id":"cus_acme","currency":"usd","recharge_below_cents":500}`), http.StatusUnprocessableEntity, "validation_error")
		require.Contains(t, p.Errors, "recharge_to_cents")
		p = requireProblem(t, b.do(http.MethodPut, "/v1/customers/acme",
			`{"stripe_customer_id":"cus_acme","currency":"usd","recharge_below_cents":500,"recharge_to_cents":400}`),
			http.StatusUnprocessableEntity, "validation_error")
		require.Contains(t, p.Errors, "recharge_to_cents")
	})
}
