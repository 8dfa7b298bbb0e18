package api_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"github.com/tally-billing/tally/apispec/apispectest"
	"github.com/tally-billing/tally/internal/api"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// testBundle is what an API test needs: a ledger on a fresh database with
// customer "acme" (usd), the HTTP handler under test (newServer), and a key
// with every scope.
type testBundle struct {
	*ledgertest.Bundle
	handler http.Handler
	secret  string // an API key secret with every scope
}

// setupOpts is what a test asks of setup; the zero value is what every API
// test uses today.
type setupOpts struct {
	ledger ledger.Config // zero fields get ledgertest's defaults
}

// setup returns the test's context and a testBundle on a fresh database, as
// opts asks.
func setup(t *testing.T, opts setupOpts) (context.Context, *testBundle) {
	t.Helper()
	ctx := t.Context()
	lb := ledgertest.New(t, opts.ledger)
	lb.Customer(t, "acme")
	b := &testBundle{
		Bundle:  lb,
		handler: newServer(t, lb.Logger, lb.Ledger, func(context.Context) error { return nil }, ""),
	}
	b.secret = b.apiKey(ctx, t, "all", ledger.Scopes...)
	return ctx, b
}

// newServer is api.NewServer held to the OpenAPI document, apispec/openapi.yaml
// (apispectest.Handler): a test fails when a request of it gets an answer the
// document does not allow, or is accepted though the document does not allow
// it. Every API test serves through it.
func newServer(t testing.TB, logger *slog.Logger, l *ledger.Ledger, ready api.ReadyFunc, webhookSecret string, opts ...api.Option) http.Handler {
	t.Helper()
	return apispectest.Handler(t, api.NewServer(logger, l, ready, webhookSecret, opts...))
}
