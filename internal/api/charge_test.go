package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestChargeList(t *testing.T) {
	t.Parallel()

	t.Run("BadParameters", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for query, field := range map[string]string{
			"customer_id=%00":                         "customer_id",
			"customer_id=%ff":                         "customer_id",
			"customer_id=a%0Ab":                       "customer_id",
			"customer_id=" + strings.Repeat("x", 256): "customer_id",
			"status=%00":                              "status",
			"status=%ff":                              "status",
			"status=paid":                             "status",
			"limit=0":                                 "limit",
			"limit=501":                               "limit",
			"limit=%00":                               "limit",
			"limit=99999999999999999999":              "limit",
			"starting_after=0":                        "starting_after",
			"starting_after=abc":                      "starting_after",
			"starting_after=%ff":                      "starting_after",
			"starting_after=99999999999999999999999999": "starting_after",
		} {
			p := requireInvalid(t, b.do(http.MethodGet, "/v1/charges?"+query, ""), field)
			require.Len(t, p.Errors, 1, "%s: %v", query, p.Errors)
		}

		// An unknown status is answered with every status there is.
		p := requireInvalid(t, b.do(http.MethodGet, "/v1/charges?status=paid", ""), "status")
		require.Equal(t, `unknown status "paid": want one of pending, processing, unknown, held, succeeded, failed, skipped, covered, canceled, carried_forward, past_due or uncollectible`, p.Errors["status"])

		// Every bad parameter is named at once.
		p = requireInvalid(t, b.do(http.MethodGet, "/v1/charges?customer_id=%00&limit=x&starting_after=%ff", ""), "customer_id")
		require.Len(t, p.Errors, 3, "%v", p.Errors)
	})

	t.Run("GoodParameters", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, query := range []string{
			"", "customer_id=acme", "customer_id=" + strings.Repeat("x", 255), "status=held", "limit=1", "limit=500",
			"starting_after=1", "customer_id=%E2%80%AE", // a format character, not a control character
		} {
			rec := b.do(http.MethodGet, "/v1/charges?"+query, "")
			require.Equal(t, http.StatusOK, rec.Code, "%s: %s", query, rec.Body)
			require.JSONEq(t, `{"data":[],"has_more":false,"next_cursor":null}`, rec.Body.String())
		}
	})
}
