package api_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// creditsBody is GET /v1/customers/{id}/credits as the API answers it.
type creditsBody struct {
	Balances []struct {
		Currency       string `json:"currency"`
		Category       string `json:"category"`
		RemainingCents int64  `json:"remaining_cents"`
	} `json:"balances"`
	Grants []struct {
		GrantID        string `json:"grant_id"`
		RemainingCents int64  `json:"remaining_cents"`
		Status         string `json:"status"`
	} `json:"grants"`
	Entries []struct {
		ID          int64  `json:"id"`
		GrantID     string `json:"grant_id"`
		Kind        string `json:"kind"`
		AmountCents int64  `json:"amount_cents"`
		ChargeID    *int64 `json:"charge_id"`
	} `json:"entries"`
	HasMore    bool    `json:"has_more"`
	NextCursor *string `json:"next_cursor"`
}

func TestCredits(t *testing.T) {
	t.Parallel()

	t.Run("GrantBurnDownAndBalance", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		grant := `{"grant_id":"welcome","amount_cents":1500,"currency":"usd","category":"promotional",` +
			`"expires_at":"2027-01-01T00:00:00Z"}`
		rec := b.do(http.MethodPost, "/v1/customers/acme/credit-grants", grant)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		require.Equal(t, "active", decodeJSON[struct {
			Status string `json:"status"`
		}](t, rec).Status)
		rec = b.do(http.MethodPost, "/v1/customers/acme/credit-grants", grant)
		require.Equal(t, http.StatusOK, rec.Code, "a replay: body: %s", rec.Body)
		requireProblem(t, b.do(http.MethodPost, "/v1/customers/acme/credit-grants",
			`{"grant_id":"welcome","amount_cents":1,"currency":"usd","category":"promotional"}`), http.StatusConflict, "grant_id_reused")

		_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "e", AmountCents: 1000})
		require.NoError(t, err)
		rec = b.do(http.MethodPost, "/v1/customers/acme/periods/2026-11/close", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		charge := decodeJSON[struct {
			Charge struct {
				ID          int64  `json:"id"`
				Status      string `json:"status"`
				AmountCents int64  `json:"amount_cents"`
			} `json:"charge"`
		}](t, rec).Charge
		require.Equal(t, "covered", charge.Status)
		require.Zero(t, charge.AmountCents)

		rec = b.do(http.MethodGet, "/v1/charges/"+strconv.FormatInt(charge.ID, 10), "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		detail := decodeJSON[struct {
			LineItems []struct {
				Kind        string `json:"kind"`
				AmountCents int64  `json:"amount_cents"`
				GrantID     string `json:"grant_id"`
			} `json:"line_items"`
		}](t, rec)
		require.Len(t, detail.LineItems, 2)
		require.Equal(t, "credit", detail.LineItems[1].Kind)
		require.Equal(t, int64(-1000), detail.LineItems[1].AmountCents)
		require.Equal(t, "welcome", detail.LineItems[1].GrantID)

		rec = b.do(http.MethodGet, "/v1/customers/acme/credits?limit=1", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		credits := decodeJSON[creditsBody](t, rec)
		require.Len(t, credits.Balances, 1)
		require.Equal(t, int64(500), credits.Balances[0].RemainingCents)
		require.Equal(t, "promotional", credits.Balances[0].Category)
		require.Len(t, credits.Grants, 1)
		require.Equal(t, "active", credits.Grants[0].Status)
		require.Len(t, credits.Entries, 1)
		require.Equal(t, "granted", credits.Entries[0].Kind)
		require.True(t, credits.HasMore)
		require.NotNil(t, credits.NextCursor)

		rec = b.do(http.MethodGet, "/v1/customers/acme/credits?starting_after="+*credits.NextCursor, "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		page := decodeJSON[creditsBody](t, rec)
		require.Len(t, page.Entries, 1)
		require.Equal(t, "applied", page.Entries[0].Kind)
		require.Equal(t, int64(-1000), page.Entries[0].AmountCents)
		require.Equal(t, charge.ID, *page.Entries[0].ChargeID)
		require.False(t, page.HasMore)

		rec = b.do(http.MethodPost, "/v1/customers/acme/credit-grants/welcome/void", `{"reason":"promotion withdrawn"}`)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		rec = b.do(http.MethodPost, "/v1/customers/acme/credit-grants/welcome/void", `{"reason":"again"}`)
		require.Equal(t, http.StatusOK, rec.Code, "a replay: body: %s", rec.Body)
		require.Equal(t, int64(-500), decodeJSON[struct {
			AmountCents int64 `json:"amount_cents"`
		}](t, rec).AmountCents)
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		requireInvalid(t, b.do(http.MethodPost, "/v1/customers/acme/credit-grants",
			`{"grant_id":"g","amount_cents":100,"currency":"usd","category":"free"}`), "category")
		requireInvalid(t, b.do(http.MethodPost, "/v1/customers/acme/credit-grants",
			`{"grant_id":"g","amount_cents":100,"currency":"usd","category":"paid","expires_at":"2020-01-01T00:00:00Z"}`), "expires_at")
		requireProblem(t, b.do(http.MethodPost, "/v1/customers/nobody/credit-grants",
			`{"grant_id":"g","amount_cents":100,"currency":"usd","category":"paid"}`), http.StatusNotFound, "not_found")
		requireProblem(t, b.do(http.MethodPost, "/v1/customers/acme/credit-grants/nope/void", `{"reason":"x"}`),
			http.StatusNotFound, "not_found")
		requireInvalid(t, b.do(http.MethodGet, "/v1/customers/acme/credits?limit=0", ""), "limit")
		requireProblem(t, b.do(http.MethodGet, "/v1/customers/nobody/credits", ""), http.StatusNotFound, "not_found")

		reader := b.apiKey(ctx, t, "reader", ledger.ScopeBillingRead)
		req := b.newRequest(http.MethodPost, "/v1/customers/acme/credit-grants",
			`{"grant_id":"g","amount_cents":100,"currency":"usd","category":"paid"}`)
		req.Header.Set("Authorization", "Bearer "+reader)
		requireProblem(t, b.serve(req), http.StatusForbidden, "forbidden")
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.credit_grants`))
	})
}
