package api_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestUsageEventVoid(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	for _, id := range []string{"keep", "wrong"} {
		rec := b.do(http.MethodPost, "/v1/usage-events", eventJSON(id, 700))
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
	}
	type voidBody struct {
		CustomerID string `json:"customer_id"`
		EventID    string `json:"event_id"`
		Period     string `json:"period"`
		Reason     string `json:"reason"`
		VoidedBy   string `json:"voided_by"`
		Event      struct {
			AmountCents int64 `json:"amount_cents"`
		} `json:"event"`
	}
	rec := b.do(http.MethodPost, "/v1/usage-events/void", `{"customer_id":"acme","event_id":"wrong","reason":"sent twice"}`)
	require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
	v := decodeJSON[voidBody](t, rec)
	require.Equal(t, "wrong", v.EventID)
	require.Equal(t, "2026-11", v.Period)
	require.Equal(t, "sent twice", v.Reason)
	require.Regexp(t, `^operator:\S+/tly_`, v.VoidedBy, "the calling key")
	require.Equal(t, int64(700), v.Event.AmountCents)

	rec = b.do(http.MethodPost, "/v1/usage-events/void", `{"customer_id":"acme","event_id":"wrong","reason":"again"}`)
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	require.Equal(t, "true", rec.Header().Get("Idempotent-Replayed"))
	require.Equal(t, "sent twice", decodeJSON[voidBody](t, rec).Reason, "the first void")

	requireProblem(t, b.do(http.MethodPost, "/v1/usage-events/void", `{"customer_id":"acme","event_id":"nope","reason":"x"}`),
		http.StatusNotFound, "not_found")
	requireInvalid(t, b.do(http.MethodPost, "/v1/usage-events/void", `{"customer_id":"acme","event_id":"keep"}`), "reason")
	requireInvalid(t, b.do(http.MethodPost, "/v1/usage-events/void", `{"customer_id":"acme","event_id":"keep","reason":"x","why":1}`), "why")

	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	require.Equal(t, int64(700), c.AmountCents, "the voided event is left out")
	p := requireProblem(t, b.do(http.MethodPost, "/v1/usage-events/void", `{"customer_id":"acme","event_id":"keep","reason":"x"}`),
		http.StatusConflict, "period_closed")
	require.Contains(t, p.Detail, "refund the event's amount")
}
