package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// testBundle is a fresh database and a ledger on it.
type testBundle struct {
	env    func(string) string
	ledger *ledger.Ledger
	pool   *pgxpool.Pool
}

func setup(ctx context.Context, t *testing.T) *testBundle {
	t.Helper()
	pool, url := testdb.New(t)
	l, err := ledger.New(pool, ledger.Config{})
	require.NoError(t, err)
	return &testBundle{
		env: func(k string) string {
			if k == "DATABASE_URL" {
				return url
			}
			return ""
		},
		ledger: l,
		pool:   pool,
	}
}

// billingctl runs the command with args and returns its stdout and stderr.
func (b *testBundle) billingctl(ctx context.Context, args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, b.env, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// create runs apikey create and returns the secret it printed.
func (b *testBundle) create(ctx context.Context, t *testing.T, name, scopes string) string {
	t.Helper()
	stdout, stderr, err := b.billingctl(ctx, "apikey", "create", "--name", name, "--scopes", scopes)
	require.NoError(t, err, "stderr: %s", stderr)
	require.True(t, strings.HasSuffix(stdout, "\n"))
	secret := strings.TrimSuffix(stdout, "\n")
	require.NotContains(t, secret, "\n", "stdout holds only the secret: %q", stdout)
	return secret
}

// keyPrefix is the public part of a secret: tly_<10 hex>.
func keyPrefix(secret string) string { return secret[:len("tly_")+10] }

func TestAPIKey(t *testing.T) {
	t.Parallel()

	t.Run("CreatePrintsOnlyTheSecret", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		stdout, stderr, err := b.billingctl(ctx, "apikey", "create", "--name", "ingest", "--scopes", "usage:write, billing:read")
		require.NoError(t, err)
		require.Regexp(t, `^tly_[0-9a-f]{10}_[A-Za-z0-9_-]{43}\n$`, stdout)
		secret := strings.TrimSpace(stdout)
		require.NotContains(t, stderr, secret)
		require.Contains(t, stderr, keyPrefix(secret))
		require.Contains(t, stderr, "ingest")

		key, err := b.ledger.APIKeyAuthenticate(ctx, secret)
		require.NoError(t, err)
		require.Equal(t, "ingest", key.Name)
		require.Equal(t, []ledger.Scope{ledger.ScopeUsageWrite, ledger.ScopeBillingRead}, key.Scopes)
	})

	t.Run("CreateRequiresName", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		stdout, _, err := b.billingctl(ctx, "apikey", "create", "--scopes", "admin")
		require.ErrorContains(t, err, "--name")
		require.Empty(t, stdout)
	})

	t.Run("CreateWithBadScope", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		for _, scopes := range []string{"usage:write,billing:wrte", "billing:wrte", ""} {
			stdout, _, err := b.billingctl(ctx, "apikey", "create", "--name", "x", "--scopes", scopes)
			require.ErrorContains(t, err, "--scopes", scopes)
			require.Empty(t, stdout)
		}
		_, _, err := b.billingctl(ctx, "apikey", "create", "--name", "x", "--scopes", "usage:write,billing:wrte")
		require.ErrorContains(t, err, `"billing:wrte"`)
		keys, err := b.ledger.APIKeyList(ctx)
		require.NoError(t, err)
		require.Empty(t, keys)
	})

	t.Run("ListShowsKeysWithoutSecrets", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		first := b.create(ctx, t, "first", "usage:write")
		second := b.create(ctx, t, "second", "admin,billing:read")
		_, _, err := b.billingctl(ctx, "apikey", "revoke", "first")
		require.NoError(t, err)

		stdout, _, err := b.billingctl(ctx, "apikey", "list")
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		require.Len(t, lines, 3, stdout)
		require.Equal(t, []string{"PREFIX", "NAME", "SCOPES", "CREATED", "LAST", "USED", "REVOKED"}, strings.Fields(lines[0]))
		row1, row2 := strings.Fields(lines[1]), strings.Fields(lines[2])
		require.Equal(t, []string{keyPrefix(first), "first", "usage:write"}, row1[:3])
		require.NotEqual(t, "-", row1[5], "first is revoked")
		require.Equal(t, []string{keyPrefix(second), "second", "admin,billing:read"}, row2[:3])
		require.Equal(t, "-", row2[5], "second is live")
		for _, secret := range []string{first, second} {
			require.NotContains(t, stdout, secret)
			require.NotContains(t, stdout, secret[len(keyPrefix(secret))+1:])
		}
	})

	t.Run("RevokeByName", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		secret := b.create(ctx, t, "ci", "usage:write")
		other := b.create(ctx, t, "other", "usage:write")
		stdout, stderr, err := b.billingctl(ctx, "apikey", "revoke", "ci")
		require.NoError(t, err)
		require.Empty(t, stdout)
		require.Contains(t, stderr, keyPrefix(secret))

		_, err = b.ledger.APIKeyAuthenticate(ctx, secret)
		require.ErrorIs(t, err, ledger.ErrUnauthenticated)
		_, err = b.ledger.APIKeyAuthenticate(ctx, other)
		require.NoError(t, err, "other keys stay live")

		_, _, err = b.billingctl(ctx, "apikey", "revoke", "ci")
		require.ErrorContains(t, err, `"ci"`, "a revoked key cannot be revoked again")
	})

	t.Run("RevokeByPrefix", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		secret := b.create(ctx, t, "ci", "usage:write")
		_, err := b.ledger.APIKeyAuthenticate(ctx, secret)
		require.NoError(t, err)

		_, _, err = b.billingctl(ctx, "apikey", "revoke", keyPrefix(secret))
		require.NoError(t, err)
		// A server that authenticated the key trusts it for the cache's TTL
		// (ledger.APIKeyCacheTTLDefault); a fresh one refuses it at once.
		fresh, err := ledger.New(b.pool, ledger.Config{})
		require.NoError(t, err)
		_, err = fresh.APIKeyAuthenticate(ctx, secret)
		require.ErrorIs(t, err, ledger.ErrUnauthenticated)
	})

	t.Run("RevokeNameOfSeveralKeys", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		one := b.create(ctx, t, "dup", "usage:write")
		two := b.create(ctx, t, "dup", "usage:write")
		_, _, err := b.billingctl(ctx, "apikey", "revoke", "dup")
		require.ErrorContains(t, err, "prefix")
		for _, secret := range []string{one, two} {
			_, err := b.ledger.APIKeyAuthenticate(ctx, secret)
			require.NoError(t, err, "nothing was revoked")
		}
	})

	t.Run("RevokeUnknown", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		_, _, err := b.billingctl(ctx, "apikey", "revoke", "tly_0000000000")
		require.ErrorContains(t, err, "tly_0000000000")
	})
}

func TestRun(t *testing.T) {
	t.Parallel()

	t.Run("MissingDatabaseURL", func(t *testing.T) {
		t.Parallel()
		err := run(t.Context(), []string{"apikey", "list"}, func(string) string { return "" }, &bytes.Buffer{}, &bytes.Buffer{})
		require.ErrorContains(t, err, "DATABASE_URL")
	})

	t.Run("UnknownCommand", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		_, _, err := b.billingctl(ctx, "apikey", "rotate")
		require.ErrorContains(t, err, `"apikey rotate"`)
		_, _, err = b.billingctl(ctx, "apikey")
		require.ErrorContains(t, err, "usage")
	})
}
