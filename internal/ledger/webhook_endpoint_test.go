package ledger_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// createEndpoint creates an endpoint to url for every type.
func (b *testBundle) createEndpoint(ctx context.Context, url string) (*ledger.WebhookEndpoint, error) {
	return b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: url, Events: []string{ledger.NotifyAll}})
}

// requireRefused requires err to be the *ValidationError of field, its
// message containing want.
func requireRefused(t *testing.T, err error, field, want string) {
	t.Helper()
	var ve *ledger.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Contains(t, ve.Fields[field], want, "fields: %v", ve.Fields)
}

func TestWebhookEndpointCreate(t *testing.T) {
	t.Parallel()

	t.Run("AllowedNetwork", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{ledger: ledger.Config{WebhooksAllow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}})
		b.Resolver.Set("hooks.corp.example", netip.MustParseAddr("10.1.2.3"))
		for _, url := range []string{"https://10.1.2.3/h", "https://hooks.corp.example/h", "https://example.com/h"} {
			_, err := b.createEndpoint(ctx, url)
			require.NoError(t, err, url)
		}
		_, err := b.createEndpoint(ctx, "https://192.168.1.1/h")
		requireRefused(t, err, "url", "192.168.1.1 is not a public address")
		_, err = b.createEndpoint(ctx, "http://10.1.2.3/h")
		requireRefused(t, err, "url", "must use https")
	})

	t.Run("ConcurrentCreatesHoldTheLimit", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		for range ledger.WebhookEndpointsMax - 1 {
			_, err := b.createEndpoint(ctx, "https://example.com/h")
			require.NoError(t, err)
		}
		// Another creation makes the 16th and has not committed yet: a
		// count now would still find 15.
		tx, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `INSERT INTO billing.webhook_endpoints (url, events, secret, created_at, updated_at)
VALUES ('https://example.com/other', '{*}', 'whsec_x', now(), now())`)
		require.NoError(t, err)

		created := make(chan error, 1)
		go func() {
			_, err := b.createEndpoint(ctx, "https://example.com/late")
			created <- err
		}()
		require.Eventually(t, func() bool { // the ledger's creation waits for the other's lock (or ends, wrongly)
			return len(created) == 1 || b.Count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 1
		}, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, tx.Commit(ctx))
		requireRefused(t, <-created, "webhook_endpoints", fmt.Sprintf("has %d webhook endpoints, the most it may have", ledger.WebhookEndpointsMax))
		require.Equal(t, int64(ledger.WebhookEndpointsMax), b.Count(t, `SELECT count(*) FROM billing.webhook_endpoints`))
	})

	t.Run("EventsBounded", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		for _, tc := range []struct {
			events []string
			want   string
		}{
			{[]string{"charge.failed", "period.closed", "charge.failed"}, `"charge.failed" is listed twice; list each type once`},
			{[]string{"*", "charge.failed"}, `"*" subscribes to every type: send ["*"] alone`},
			{[]string{"*", "*"}, `"*" subscribes to every type: send ["*"] alone`},
			{append(append([]string{}, ledger.NotificationTypes...), "charge.failed"),
				fmt.Sprintf("lists %d types; there are %d", len(ledger.NotificationTypes)+1, len(ledger.NotificationTypes))},
		} {
			_, err := b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: "https://example.com/h", Events: tc.events})
			requireRefused(t, err, "events", tc.want)
		}
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.webhook_endpoints`))
		e, err := b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: "https://example.com/h", Events: ledger.NotificationTypes})
		require.NoError(t, err)
		require.Equal(t, ledger.NotificationTypes, e.Events)
	})

	t.Run("LimitPerDeployment", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		var first *ledger.WebhookEndpoint
		for i := range ledger.WebhookEndpointsMax {
			e, err := b.createEndpoint(ctx, fmt.Sprintf("https://example.com/%d", i))
			require.NoError(t, err)
			if i == 0 {
				first = e
			}
		}
		// A disabled endpoint counts: notifications are written for it.
		_, err := b.Pool.Exec(ctx, `UPDATE billing.webhook_endpoints SET disabled_at = now(), disabled_reason = 'failing' WHERE id = $1`, first.ID)
		require.NoError(t, err)
		_, err = b.createEndpoint(ctx, "https://example.com/17")
		requireRefused(t, err, "webhook_endpoints", "this deployment has 16 webhook endpoints, the most it may have")

		// A deleted one does not, and coming back is a creation.
		require.NoError(t, b.Ledger.WebhookEndpointDelete(ctx, first.ID))
		_, err = b.createEndpoint(ctx, "https://example.com/17")
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `UPDATE billing.webhook_endpoints SET deleted_at = NULL WHERE id = $1`, first.ID)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "webhook_endpoints_max", pgErr.ConstraintName)
	})

	t.Run("NonPublicAddressRefused", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		for url, want := range map[string]string{
			"https://10.0.0.1/h":                 "10.0.0.1 is not a public address: it is in 10.0.0.0/8, a private network (RFC 1918)",
			"https://100.100.100.200/h":          "it is in 100.64.0.0/10, carrier-grade NAT space",
			"https://[fd00:ec2::254]/h":          "it is in fc00::/7, unique local",
			"https://[64:ff9b::a9fe:a9fe]/h":     "it embeds 169.254.169.254, which is in 169.254.0.0/16, link-local",
			"https://[::ffff:192.168.0.1]:8443/": "192.168.0.1 is not a public address",
			"https://localhost/h":                "127.0.0.1 is not a public address: it is in 127.0.0.0/8, loopback",
			"https://198.18.0.9/h":               "it is in 198.18.0.0/15, benchmarking",
		} {
			_, err := b.createEndpoint(ctx, url)
			requireRefused(t, err, "url", want)
			requireRefused(t, err, "url", "unless TALLY_WEBHOOKS_ALLOW_CIDRS allows its network")
		}

		// A name is resolved: refused when it points to a non-public
		// address, accepted when it does not resolve (each delivery checks
		// the address it dials).
		b.Resolver.Set("rebind.example", netip.MustParseAddr("93.184.215.14"), netip.MustParseAddr("172.17.0.1"))
		_, err := b.createEndpoint(ctx, "https://rebind.example/h")
		requireRefused(t, err, "url", "host rebind.example resolves to 172.17.0.1, and 172.17.0.1 is not a public address")
		_, err = b.createEndpoint(ctx, "https://not-yet.example/h")
		require.NoError(t, err)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.webhook_endpoints`))
	})
}
