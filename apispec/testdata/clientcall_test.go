package tallyclient

// TestClient (apispec/client_test.go) copies this file next to a client it
// generates from apispec/openapi.yaml with oapi-codegen and runs it there: the
// calls below go through the generated client to Tally's API on a test
// database, and every answer is also checked against the document.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/apispec/apispectest"
	"github.com/tally-billing/tally/internal/api"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

func TestGeneratedClient(t *testing.T) {
	ctx := t.Context()
	lb := ledgertest.New(t, ledger.Config{})
	srv := httptest.NewServer(apispectest.Handler(t, api.NewServer(lb.Logger, lb.Ledger, func(context.Context) error { return nil }, "")))
	t.Cleanup(srv.Close)
	secret, _, err := lb.Ledger.APIKeyCreate(ctx, "client", ledger.Scopes)
	require.NoError(t, err)
	client, err := NewClientWithResponses(srv.URL, WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+secret)
		return nil
	}))
	require.NoError(t, err)

	doc, err := client.OpenAPIDocumentWithResponse(ctx)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, doc.StatusCode())
	require.Equal(t, "3.1.0", (*doc.YAML200)["openapi"])

	pm := "pm_1"
	put, err := client.CustomerPutWithResponse(ctx, "acme", CustomerPutJSONRequestBody{
		StripeCustomerId: "cus_acme", StripePaymentMethodId: &pm, Currency: "USD",
	})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, put.StatusCode(), "%s", put.Body)
	require.Equal(t, "acme", put.JSON201.CustomerId)
	require.Equal(t, "usd", put.JSON201.Currency)
	require.Equal(t, &pm, put.JSON201.StripePaymentMethodId)
	require.Nil(t, put.JSON201.MaxChargeCents)

	amount, metric := int64(1250), "api_calls"
	event := UsageEventCreateJSONRequestBody{
		CustomerId: "acme", EventId: "evt-1", AmountCents: &amount, Metric: &metric,
		Properties: &map[string]interface{}{"region": "eu"},
	}
	created, err := client.UsageEventCreateWithResponse(ctx, event)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, created.StatusCode(), "%s", created.Body)
	require.Equal(t, int64(1250), *created.JSON201.AmountCents)
	require.Equal(t, "2026-11", created.JSON201.Period)
	require.Equal(t, map[string]interface{}{"region": "eu"}, created.JSON201.Properties)

	replayed, err := client.UsageEventCreateWithResponse(ctx, event)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, replayed.StatusCode())
	require.Equal(t, "true", replayed.Headers200.IdempotentReplayed)
	require.Equal(t, created.JSON201.ReceivedAt, replayed.JSON200.ReceivedAt)

	unknown, err := client.CustomerGetWithResponse(ctx, "ghost")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, unknown.StatusCode())
	require.Equal(t, NotFoundCode("not_found"), unknown.ApplicationproblemJSON404.Code)
	require.Equal(t, unknown.HTTPResponse.Header.Get("X-Request-Id"), unknown.ApplicationproblemJSON404.RequestId)

	periods, err := client.PeriodListWithResponse(ctx, "acme", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, periods.StatusCode(), "%s", periods.Body)
	require.Len(t, periods.JSON200.Data, 1)
	require.Equal(t, int64(1250), periods.JSON200.Data[0].TotalCents)
	require.Equal(t, PeriodStatus("open"), periods.JSON200.Data[0].Status)
	require.Nil(t, periods.JSON200.Data[0].Charge)

	status := ChargeStatus("held")
	limit := 10
	charges, err := client.ChargeListWithResponse(ctx, &ChargeListParams{Status: &status, Limit: &limit})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, charges.StatusCode(), "%s", charges.Body)
	require.Empty(t, charges.JSON200.Data)
	require.False(t, charges.JSON200.HasMore)
}
