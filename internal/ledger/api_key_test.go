package ledger_test

import (
	"fmt"
	"strings"
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

// An unknown secret is refused from memory for APIKeyCacheTTL: many requests
// with one bad secret cost one query, distinct bad secrets beyond
// APIKeyUnknownMax are not all remembered, and a key created with a secret
// refused before works at once through the same Ledger, and through another
// once the TTL ended.
func TestAPIKeyAuthenticateUnknown(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{noCustomer: true})
	l, counter := countingLedger(t, b, ledger.Config{})
	scopes := []ledger.Scope{ledger.ScopeUsageWrite}
	requireUnknown := func(t *testing.T, secret string) {
		t.Helper()
		_, err := l.APIKeyAuthenticate(ctx, secret)
		require.ErrorIs(t, err, ledger.ErrUnauthenticated, secret)
	}

	t.Run("CreatedKeyWorks", func(t *testing.T) {
		secret := "tly_0a1b2c3d4e_" + strings.Repeat("s", 43)
		requireUnknown(t, secret)
		_, err := l.APIKeyCreateWithSecret(ctx, "here", scopes, secret)
		require.NoError(t, err)
		key, err := l.APIKeyAuthenticate(ctx, secret)
		require.NoError(t, err, "created through this ledger: works at once")
		require.Equal(t, "here", key.Name)

		secret = "tly_5f6a7b8c9d_" + strings.Repeat("s", 43)
		requireUnknown(t, secret)
		_, err = b.Ledger.APIKeyCreateWithSecret(ctx, "elsewhere", scopes, secret)
		require.NoError(t, err)
		requireUnknown(t, secret) // created by another process: refused until the TTL ends
		b.Clock.Advance(ledger.APIKeyCacheTTLDefault)
		key, err = l.APIKeyAuthenticate(ctx, secret)
		require.NoError(t, err, "created elsewhere: works once the TTL ended")
		require.Equal(t, "elsewhere", key.Name)
	})

	t.Run("DistinctSecretsAreBounded", func(t *testing.T) {
		n := ledger.APIKeyUnknownMax + 100
		secret := func(i int) string { return fmt.Sprintf("tly_flood_%06d", i) }
		counter.reset()
		for i := range n {
			requireUnknown(t, secret(i))
		}
		require.Equal(t, int64(n), counter.n.Load(), "a query per distinct secret")
		require.Equal(t, ledger.APIKeyUnknownMax, l.APIKeyUnknownCached())

		counter.reset()
		requireUnknown(t, secret(n-1))
		require.Zero(t, counter.n.Load(), "the newest are remembered")
		requireUnknown(t, secret(0))
		require.Equal(t, int64(1), counter.n.Load(), "the oldest are forgotten")
	})

	t.Run("OneQueryPerTTL", func(t *testing.T) {
		secret := "tly_0000000000_unknown"
		counter.reset()
		for range 100 {
			requireUnknown(t, secret)
		}
		require.Equal(t, int64(1), counter.n.Load(), "statements for 100 requests with one unknown secret:\n%s", counter)
		b.Clock.Advance(ledger.APIKeyCacheTTLDefault)
		requireUnknown(t, secret)
		require.Equal(t, int64(2), counter.n.Load(), "read again once the TTL ended")
	})
}
