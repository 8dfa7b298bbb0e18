package api_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/webhook"
)

type webhookEndpointBody struct {
	ID                      int64      `json:"id"`
	URL                     string     `json:"url"`
	Events                  []string   `json:"events"`
	Description             string     `json:"description"`
	Secret                  *string    `json:"secret"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
}

func TestWebhookEndpoints(t *testing.T) {
	t.Parallel()

	t.Run("CreateListRotateDelete", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.do(http.MethodPost, "/v1/webhook-endpoints",
			`{"url":"https://example.com/tally","events":["charge.failed","period.closed"],"description":"billing ops"}`)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		created := decodeJSON[webhookEndpointBody](t, rec)
		require.Equal(t, "https://example.com/tally", created.URL)
		require.Equal(t, []string{"charge.failed", "period.closed"}, created.Events)
		require.Equal(t, "billing ops", created.Description)
		require.NotNil(t, created.Secret)
		require.Regexp(t, `^whsec_`, *created.Secret)
		require.Nil(t, created.PreviousSecretExpiresAt)

		rec = b.do(http.MethodGet, "/v1/webhook-endpoints", "")
		require.Equal(t, http.StatusOK, rec.Code)
		list := decodeJSON[struct{ Data []webhookEndpointBody }](t, rec)
		require.Len(t, list.Data, 1)
		require.Nil(t, list.Data[0].Secret, "a list never shows a secret")
		require.NotContains(t, rec.Body.String(), *created.Secret)

		path := fmt.Sprintf("/v1/webhook-endpoints/%d", created.ID)
		rec = b.do(http.MethodPost, path+"/rotate-secret", `{"grace_period_seconds":3600}`)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		rotated := decodeJSON[webhookEndpointBody](t, rec)
		require.NotEqual(t, *created.Secret, *rotated.Secret)
		require.Equal(t, b.Clock.Now().Add(time.Hour).UTC(), rotated.PreviousSecretExpiresAt.UTC())

		require.Equal(t, http.StatusNoContent, b.do(http.MethodDelete, path, "").Code)
		requireProblem(t, b.do(http.MethodDelete, path, ""), http.StatusNotFound, "not_found")
		requireProblem(t, b.do(http.MethodPost, path+"/rotate-secret", `{}`), http.StatusNotFound, "not_found")
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		p := requireInvalid(t, b.do(http.MethodPost, "/v1/webhook-endpoints", `{"url":"http://example.com/h","events":["*"]}`), "url")
		require.Contains(t, p.Errors["url"], "must use https")
		requireInvalid(t, b.do(http.MethodPost, "/v1/webhook-endpoints", `{"url":"https://example.com/h","events":[]}`), "events")
		p = requireInvalid(t, b.do(http.MethodPost, "/v1/webhook-endpoints", `{"url":"https://example.com/h","events":["period.closed","period.closed"]}`), "events")
		require.Equal(t, `"period.closed" is listed twice; list each type once`, p.Errors["events"])
		p = requireInvalid(t, b.do(http.MethodPost, "/v1/webhook-endpoints", `{"url":"https://[fd00:ec2::254]/h","events":["*"]}`), "url")
		require.Contains(t, p.Errors["url"], "fd00:ec2::254 is not a public address: it is in fc00::/7, unique local")
		requireInvalid(t, b.do(http.MethodPost, "/v1/webhook-endpoints/x/rotate-secret", `{}`), "id")
		requireInvalid(t, b.do(http.MethodPost, "/v1/webhook-endpoints/1/rotate-secret", `{"grace_period_seconds":-1}`), "grace_period_seconds")
		require.Zero(t, b.Count(t, "SELECT count(*) FROM billing.webhook_endpoints"))
	})

	t.Run("LimitPerDeployment", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for range ledger.WebhookEndpointsMax {
			rec := b.do(http.MethodPost, "/v1/webhook-endpoints", `{"url":"https://example.com/h","events":["*"]}`)
			require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		}
		p := requireInvalid(t, b.do(http.MethodPost, "/v1/webhook-endpoints", `{"url":"https://example.com/h","events":["*"]}`), "webhook_endpoints")
		require.Contains(t, p.Errors["webhook_endpoints"], "has 16 webhook endpoints, the most it may have")
	})

	t.Run("LoopbackHTTPWhenAllowed", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{ledger: ledger.Config{WebhooksAllow: webhook.LoopbackNetworks()}})
		rec := b.do(http.MethodPost, "/v1/webhook-endpoints", `{"url":"http://127.0.0.1:9000/h","events":["*"]}`)
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	})
}
