package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// An authenticated key is read from Postgres once per APIKeyCacheTTL: a key
// revoked by another process keeps working at most that long, one revoked
// through the same Ledger stops at once.
func TestAPIKeyAuthenticateCache(t *testing.T) {
	ctx, b := setup(t, setupOpts{noCustomer: true})
	l, counter := countingLedger(t, b, ledger.Config{})
	other := b.Ledger // another replica, or billingctl

	secret, _, err := other.APIKeyCreate(ctx, "cached", []ledger.Scope{ledger.ScopeUsageWrite})
	require.NoError(t, err)

	_, err = l.APIKeyAuthenticate(ctx, secret)
	require.NoError(t, err)
	counter.n.Store(0)
	for range 10 {
		key, err := l.APIKeyAuthenticate(ctx, secret)
		require.NoError(t, err)
		require.Equal(t, "cached", key.Name)
	}
	require.Zero(t, counter.n.Load(), "statements for a key authenticated within the TTL")

	_, err = other.APIKeyRevoke(ctx, "cached")
	require.NoError(t, err)
	_, err = l.APIKeyAuthenticate(ctx, secret)
	require.NoError(t, err, "revoked elsewhere: trusted until the TTL ends")
	b.Clock.Advance(ledger.APIKeyCacheTTLDefault)
	_, err = l.APIKeyAuthenticate(ctx, secret)
	require.ErrorIs(t, err, ledger.ErrUnauthenticated, "revoked elsewhere: refused once the TTL ended")

	secret, _, err = l.APIKeyCreate(ctx, "local", []ledger.Scope{ledger.ScopeUsageWrite})
	require.NoError(t, err)
	_, err = l.APIKeyAuthenticate(ctx, secret)
	require.NoError(t, err)
	_, err = l.APIKeyRevoke(ctx, "local")
	require.NoError(t, err)
	_, err = l.APIKeyAuthenticate(ctx, secret)
	require.ErrorIs(t, err, ledger.ErrUnauthenticated, "revoked through this ledger: refused at once")

	_, err = l.APIKeyAuthenticate(ctx, "tly_unknown")
	require.ErrorIs(t, err, ledger.ErrUnauthenticated)
}
