package api_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/api"
	"github.com/tally-billing/tally/internal/ledger"
)

func TestChargeStatement(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "e", AmountCents: 1500})
	require.NoError(t, err)
	rec := b.do(http.MethodPost, "/v1/customers/acme/credit-grants",
		`{"grant_id":"welcome","amount_cents":1500,"currency":"usd","category":"promotional"}`)
	require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	require.Equal(t, ledger.ChargeCovered, c.Status)
	path := "/v1/charges/" + strconv.FormatInt(c.ID, 10) + "/statement"

	rec = b.do(http.MethodGet, path, "")
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	s := decodeJSON[struct {
		Number         int64 `json:"number"`
		SubtotalCents  int64 `json:"subtotal_cents"`
		CreditsCents   int64 `json:"credits_cents"`
		TotalCents     int64 `json:"total_cents"`
		CreditsApplied []struct {
			GrantID     string `json:"grant_id"`
			AmountCents int64  `json:"amount_cents"`
		} `json:"credits_applied"`
		LineItems     []struct{ Kind string } `json:"line_items"`
		PaymentIntent *struct{ ID string }    `json:"payment_intent"`
	}](t, rec)
	require.Equal(t, int64(1), s.Number)
	require.Equal(t, int64(1500), s.SubtotalCents)
	require.Equal(t, int64(1500), s.CreditsCents)
	require.Zero(t, s.TotalCents)
	require.Len(t, s.CreditsApplied, 1)
	require.Equal(t, "welcome", s.CreditsApplied[0].GrantID)
	require.Len(t, s.LineItems, 1, "credits are listed apart from the line items")
	require.Nil(t, s.PaymentIntent)

	req := b.newRequest(http.MethodGet, path, "")
	req.Header.Set("Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
	rec = b.serve(req)
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	html := rec.Body.String()
	for _, want := range []string{"<title>Statement 1</title>", "acme", "2026-11", "Usage priced by the producer",
		"$15.00", "Credits from grant welcome", "-$15.00", "$0.00", "Paid in full with credits"} {
		require.Contains(t, html, want)
	}

	pending, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	require.Equal(t, c.ID, pending.ID)
	b.Customer(t, "beta")
	_, err = b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "beta", EventID: "e", AmountCents: 900})
	require.NoError(t, err)
	open, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "beta", Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	requireProblem(t, b.do(http.MethodGet, "/v1/charges/"+strconv.FormatInt(open.ID, 10)+"/statement", ""),
		http.StatusConflict, "charge_not_settled")
	requireProblem(t, b.do(http.MethodGet, "/v1/charges/424242/statement", ""), http.StatusNotFound, "not_found")
	require.False(t, strings.Contains(html, "{{"), "the template rendered whole")
}

func TestFormatMoney(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ currency, minor, want string }{
		{"usd", "1500", "$15.00"}, {"usd", "-300", "-$3.00"}, {"usd", "0", "$0.00"}, {"usd", "0.5", "$0.005"},
		{"usd", "520.05", "$5.2005"}, {"usd", "250", "$2.50"}, {"jpy", "1500", "¥1500"}, {"chf", "1250", "CHF 12.50"},
	} {
		require.Equal(t, tc.want, api.FormatMoney(tc.currency, tc.minor), "%s %s", tc.minor, tc.currency)
	}
}
