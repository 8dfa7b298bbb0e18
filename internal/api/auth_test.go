package api_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestAuth(t *testing.T) {
	t.Parallel()

	const path = "/v1/customers/acme"

	t.Run("BadKey", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, secret := range []string{
			"tly_0000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", // well-formed, unknown
			b.secret + "x",
			"not-a-tally-key",
		} {
			req := b.newRequest(http.MethodGet, path, "")
			req.Header.Set("Authorization", "Bearer "+secret)
			rec := b.serve(req)
			requireProblem(t, rec, http.StatusUnauthorized, "unauthenticated")
			require.Contains(t, rec.Header().Get("WWW-Authenticate"), `error="invalid_token"`)
		}
	})

	t.Run("MissingHeader", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodGet, path, "")
		req.Header.Del("Authorization")
		rec := b.serve(req)
		requireProblem(t, rec, http.StatusUnauthorized, "unauthenticated")
		require.Equal(t, `Bearer realm="tally"`, rec.Header().Get("WWW-Authenticate"))
	})

	t.Run("MissingScope", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodGet, path, "")
		req.Header.Set("Authorization", "Bearer "+b.apiKey(ctx, t, "writer", ledger.ScopeUsageWrite))
		p := requireProblem(t, b.serve(req), http.StatusForbidden, "forbidden")
		require.Contains(t, p.Detail, string(ledger.ScopeBillingRead))
	})

	t.Run("NotBearer", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, header := range []string{"Basic " + b.secret, b.secret, "Bearer ", "Bearer"} {
			req := b.newRequest(http.MethodGet, path, "")
			req.Header.Set("Authorization", header)
			requireProblem(t, b.serve(req), http.StatusUnauthorized, "unauthenticated")
		}
	})

	t.Run("RejectedBeforeBodyIsRead", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodPost, "/v1/usage-events", eventJSON("e1", 100))
		req.Header.Del("Authorization")
		requireProblem(t, b.requireNothingWritten(t, req), http.StatusUnauthorized, "unauthenticated")
	})

	t.Run("RevokedKey", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		secret := b.apiKey(ctx, t, "soon-revoked", ledger.ScopeBillingRead)
		req := b.newRequest(http.MethodGet, path, "")
		req.Header.Set("Authorization", "Bearer "+secret)
		require.Equal(t, http.StatusOK, b.serve(req).Code)

		_, err := b.Ledger.APIKeyRevoke(ctx, "soon-revoked")
		require.NoError(t, err)
		req = b.newRequest(http.MethodGet, path, "")
		req.Header.Set("Authorization", "Bearer "+secret)
		requireProblem(t, b.serve(req), http.StatusUnauthorized, "unauthenticated")
	})

	t.Run("RouteScopes", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		keys := map[ledger.Scope]struct{ only, allBut string }{}
		for _, scope := range ledger.Scopes {
			others := slices.DeleteFunc(slices.Clone(ledger.Scopes), func(s ledger.Scope) bool { return s == scope })
			keys[scope] = struct{ only, allBut string }{
				only:   b.apiKey(ctx, t, "only-"+string(scope), scope),
				allBut: b.apiKey(ctx, t, "all-but-"+string(scope), others...),
			}
		}
		// requireScope requires 403 (and no write) with every scope but scope,
		// and success with scope alone.
		requireScope := func(method, path, body string, scope ledger.Scope) {
			t.Helper()
			req := b.newRequest(method, path, body)
			req.Header.Set("Authorization", "Bearer "+keys[scope].allBut)
			p := requireProblem(t, b.requireNothingWritten(t, req), http.StatusForbidden, "forbidden")
			require.Contains(t, p.Detail, string(scope), "%s %s", method, path)

			req = b.newRequest(method, path, body)
			req.Header.Set("Authorization", "Bearer "+keys[scope].only)
			rec := b.serve(req)
			require.Less(t, rec.Code, 300, "%s %s with only %s: %d %s", method, path, scope, rec.Code, rec.Body)
		}

		// Writes first, so the reads find what they read.
		requireScope(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd"}`, ledger.ScopeCustomersWrite)
		requireScope(http.MethodPost, "/v1/usage-events", eventJSON("e1", 100), ledger.ScopeUsageWrite)
		requireScope(http.MethodPost, "/v1/usage-events/batch", `{"events":[`+eventJSON("e2", 100)+`]}`, ledger.ScopeUsageWrite)
		requireScope(http.MethodPost, "/v1/customers/acme/periods/2026-11/close", "", ledger.ScopeAdmin)
		chargeID := b.Count(t, "SELECT id FROM billing.charges")
		requireScope(http.MethodPost, fmt.Sprintf("/v1/charges/%d/cancel", chargeID), `{"reason":"scope test"}`, ledger.ScopeAdmin)
		requireScope(http.MethodPost, "/v1/admin/charging/pause", `{"reason":"scope test"}`, ledger.ScopeAdmin)
		requireScope(http.MethodPost, "/v1/admin/charging/resume", `{"reason":"scope test"}`, ledger.ScopeAdmin)
		requireScope(http.MethodGet, "/v1/admin/charging", "", ledger.ScopeAdmin)
		requireScope(http.MethodPost, "/v1/webhook-endpoints", `{"url":"https://example.com/h","events":["*"]}`, ledger.ScopeAdmin)
		requireScope(http.MethodGet, "/v1/webhook-endpoints", "", ledger.ScopeAdmin)
		endpointID := b.Count(t, "SELECT min(id) FROM billing.webhook_endpoints")
		requireScope(http.MethodPost, fmt.Sprintf("/v1/webhook-endpoints/%d/rotate-secret", endpointID), `{}`, ledger.ScopeAdmin)
		requireScope(http.MethodDelete, fmt.Sprintf("/v1/webhook-endpoints/%d", endpointID), "", ledger.ScopeAdmin)
		requireScope(http.MethodGet, "/v1/customers/acme", "", ledger.ScopeBillingRead)
		requireScope(http.MethodGet, "/v1/customers/acme/periods", "", ledger.ScopeBillingRead)
		requireScope(http.MethodGet, "/v1/customers/acme/periods/2026-11", "", ledger.ScopeBillingRead)
		requireScope(http.MethodGet, "/v1/charges", "", ledger.ScopeBillingRead)
		requireScope(http.MethodGet, fmt.Sprintf("/v1/charges/%d", chargeID), "", ledger.ScopeBillingRead)
		// Approve and resolve need a held charge: TestChargeActionAuth.
	})

	t.Run("SchemeIsCaseInsensitive", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, scheme := range []string{"bearer", "BEARER"} {
			req := b.newRequest(http.MethodGet, "/v1/customers/acme", "")
			req.Header.Set("Authorization", scheme+" "+b.secret)
			require.Equal(t, http.StatusOK, b.serve(req).Code, scheme)
		}
	})
}
