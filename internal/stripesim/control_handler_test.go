package stripesim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestControlHandler(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	// call sends a raw control request, as the curl examples in docs/stripesim.md do.
	call := func(t *testing.T, bundle *testBundle, method, path, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, bundle.server.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var out map[string]any
		if len(raw) > 0 {
			require.NoError(t, json.Unmarshal(raw, &out), string(raw))
		}
		return resp.StatusCode, out
	}

	t.Run("BadBodies", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		for _, tt := range []struct{ method, path, body string }{
			{http.MethodPost, "/_sim/faults", ``},
			{http.MethodPost, "/_sim/faults", `{"customer":"cus_a","kind":"decline","typo":1}`},
			{http.MethodPost, "/_sim/faults", `{"customer":"cus_a","kind":"decline"} {}`},
			{http.MethodPost, "/_sim/clock/advance", `{}`},
			{http.MethodPost, "/_sim/clock/advance", `{"seconds":-1}`},
			{http.MethodPut, "/_sim/customers/cus_a", `{}`},
			{http.MethodPut, "/_sim/customers/cus_a", `{"default_payment_method":""}`},
			{http.MethodPut, "/_sim/customers/cus_a", `{"default_payment_method":42}`},
			{http.MethodPost, "/_sim/payment_intents/pi_1/settle", `{"status":"done"}`},
			{http.MethodPost, "/_sim/webhooks", `{"duplicate":-1}`},
		} {
			status, out := call(t, bundle, tt.method, tt.path, tt.body)
			require.Equal(t, http.StatusBadRequest, status, "%s %s %s: %v", tt.method, tt.path, tt.body, out)
			require.NotEmpty(t, out["error"])
		}
	})

	t.Run("DocumentedExamples", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, &testSetupOpts{config: Config{Now: func() time.Time { return testBaseTime }}})

		status, out := call(t, bundle, http.MethodGet, "/_sim/health", "")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, true, out["ok"])

		status, out = call(t, bundle, http.MethodPost, "/_sim/faults", `{"customer":"*","kind":"latency","latency_ms":1,"count":5}`)
		require.Equal(t, http.StatusOK, status)
		require.Len(t, out["data"], 1)

		status, out = call(t, bundle, http.MethodPost, "/_sim/clock/advance", `{"seconds":86400}`)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, float64(testBaseTime.Unix()+86400), out["unix"])
		require.Equal(t, float64(86400), out["offset_seconds"])

		status, out = call(t, bundle, http.MethodPut, "/_sim/customers/cus_a", `{"default_payment_method":null}`)
		require.Equal(t, http.StatusOK, status)
		require.Nil(t, out["invoice_settings"].(map[string]any)["default_payment_method"])

		status, _ = call(t, bundle, http.MethodPut, "/_sim/customers/cus_a", `{"default_payment_method":"pm_card_visa"}`)
		require.Equal(t, http.StatusOK, status)
		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 900, "k1"))
		require.NoError(t, err)

		status, out = call(t, bundle, http.MethodPost, "/_sim/charges/"+pi.LatestCharge.ID+"/refund", "")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, float64(900), out["amount_refunded"])
		status, out = call(t, bundle, http.MethodPost, "/_sim/charges/"+pi.LatestCharge.ID+"/dispute", "")
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "dispute", out["object"])

		status, out = call(t, bundle, http.MethodGet, "/_sim/events?type=charge.refunded", "")
		require.Equal(t, http.StatusOK, status)
		require.Len(t, out["data"], 1)
		status, out = call(t, bundle, http.MethodGet, "/_sim/events?type=refund.created", "")
		require.Equal(t, http.StatusOK, status)
		require.Len(t, out["data"], 1)
		status, out = call(t, bundle, http.MethodGet, "/_sim/events", "")
		require.Equal(t, http.StatusOK, status)
		require.Len(t, out["data"], 4)
		status, out = call(t, bundle, http.MethodGet, "/_sim/refunds", "")
		require.Equal(t, http.StatusOK, status)
		require.Len(t, out["data"], 1)
		require.Equal(t, float64(900), out["data"].([]any)[0].(map[string]any)["amount"])

		status, out = call(t, bundle, http.MethodPost, "/_sim/webhooks", `{"duplicate":2,"delay_ms":100,"reorder":true,"reorder_window":4,"reorder_flush_ms":500}`)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, float64(500), out["reorder_flush_ms"])

		status, _ = call(t, bundle, http.MethodDelete, "/_sim/faults", "")
		require.Equal(t, http.StatusNoContent, status)
		status, _ = call(t, bundle, http.MethodPost, "/_sim/reset", "")
		require.Equal(t, http.StatusNoContent, status)
		status, out = call(t, bundle, http.MethodGet, "/_sim/payment_intents", "")
		require.Equal(t, http.StatusOK, status)
		require.Empty(t, out["data"])
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		for _, tt := range []struct{ method, path, body string }{
			{http.MethodPost, "/_sim/payment_intents/pi_missing/settle", `{"status":"succeeded"}`},
			{http.MethodPut, "/_sim/customers/acct_1", `{"default_payment_method":null}`},
			{http.MethodPost, "/_sim/charges/ch_missing/refund", `{"amount":1}`},
			{http.MethodPost, "/_sim/events/evt_missing/resend", ``},
		} {
			status, out := call(t, bundle, tt.method, tt.path, tt.body)
			require.Equal(t, http.StatusNotFound, status, "%s %s: %v", tt.method, tt.path, out)
		}
	})
}
