package ledger_test

import (
	"context"
	"testing"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// testBundle is what a ledger test needs: a ledger on a fresh database
// (ledgertest.Bundle) and the package's helpers on it.
type testBundle struct {
	*ledgertest.Bundle
}

// setupOpts is what a test asks of setup; the zero value is a ledger with
// ledgertest's defaults and customer "acme" (usd).
type setupOpts struct {
	ledger     ledger.Config // zero fields get ledgertest's defaults
	noCustomer bool          // leave the database without customer "acme"
}

// setup returns a context and a testBundle on a fresh database, as opts asks.
func setup(t *testing.T, opts setupOpts) (context.Context, *testBundle) {
	t.Helper()
	b := ledgertest.New(t, opts.ledger)
	if !opts.noCustomer {
		b.Customer(t, "acme")
	}
	return context.Background(), &testBundle{b}
}
