package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestWebhooks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(ctx, t)
	count := func(query string, args ...any) int64 {
		t.Helper()
		var n int64
		require.NoError(t, b.pool.QueryRow(ctx, query, args...).Scan(&n))
		return n
	}

	// Create prints the secret alone on stdout. (The hosts are addresses:
	// a name would be looked up in the DNS.)
	stdout, stderr, err := b.billingctl(ctx, "webhooks", "create", "--url", "https://93.184.215.14/tally", "--events", "charge.failed, period.closed")
	require.NoError(t, err, stderr)
	require.Regexp(t, `^whsec_[A-Za-z0-9_-]{43}\n$`, stdout)
	secret := strings.TrimSpace(stdout)
	require.Contains(t, stderr, "created")
	_, _, err = b.billingctl(ctx, "webhooks", "create", "--url", "http://93.184.215.14/", "--events", "*")
	require.ErrorContains(t, err, "--url: must use https")
	_, _, err = b.billingctl(ctx, "webhooks", "create", "--url", "https://93.184.215.14/", "--events", "charge.paid")
	require.ErrorContains(t, err, `--events: "charge.paid" is not a notification type`)
	_, _, err = b.billingctl(ctx, "webhooks", "create", "--url", "https://93.184.215.14/", "--events", "charge.failed,charge.failed")
	require.ErrorContains(t, err, `--events: "charge.failed" is listed twice`)

	stdout, _, err = b.billingctl(ctx, "webhooks", "list")
	require.NoError(t, err)
	require.Contains(t, stdout, "https://93.184.215.14/tally")
	require.Contains(t, stdout, "charge.failed,period.closed")
	require.NotContains(t, stdout, secret)
	id := strconv.FormatInt(count(`SELECT id FROM billing.webhook_endpoints`), 10)

	stdout, stderr, err = b.billingctl(ctx, "webhooks", "rotate-secret", id, "--grace", "1h")
	require.NoError(t, err, stderr)
	require.NotEqual(t, secret, strings.TrimSpace(stdout))
	require.Contains(t, stderr, "signs beside it until")

	// A delivery that ran out of attempts is sent again, with a new job.
	_, err = b.pool.Exec(ctx, `
INSERT INTO billing.notifications (id, customer_id, type, body, created_at) VALUES ('ntf_1', 'acme', 'period.closed', '{}', now());
INSERT INTO billing.webhook_deliveries (notification_id, customer_id, endpoint_id, status, attempt_count, created_at, updated_at)
SELECT 'ntf_1', 'acme', id, 'failed', 72, now(), now() FROM billing.webhook_endpoints`)
	require.NoError(t, err)
	_, _, err = b.billingctl(ctx, "webhooks", "redeliver")
	require.ErrorContains(t, err, "name a notification, an endpoint or a time range")
	stdout, _, err = b.billingctl(ctx, "webhooks", "redeliver", "--endpoint", id, "--dry-run")
	require.NoError(t, err)
	require.Equal(t, "1 deliveries would be sent again\n", stdout)
	require.Zero(t, count(`SELECT count(*) FROM river.river_job WHERE kind = 'webhook_delivery'`))
	stdout, _, err = b.billingctl(ctx, "webhooks", "redeliver", "--notification", "ntf_1", "--since", "2000-01-01T00:00:00Z")
	require.NoError(t, err)
	require.Contains(t, stdout, "1 deliveries sent again")
	require.Equal(t, int64(1), count(`SELECT count(*) FROM billing.webhook_deliveries WHERE status = 'pending'`))
	require.Equal(t, int64(1), count(`SELECT count(*) FROM river.river_job WHERE kind = 'webhook_delivery'`))

	_, err = b.pool.Exec(ctx, `UPDATE billing.webhook_endpoints SET disabled_at = now(), disabled_reason = 'failing'`)
	require.NoError(t, err)
	stdout, _, err = b.billingctl(ctx, "webhooks", "list")
	require.NoError(t, err)
	require.Contains(t, stdout, "DISABLED since")
	_, stderr, err = b.billingctl(ctx, "webhooks", "enable", id)
	require.NoError(t, err)
	require.Contains(t, stderr, "redeliver --endpoint "+id)
	require.Zero(t, count(`SELECT count(*) FROM billing.webhook_endpoints WHERE disabled_at IS NOT NULL`))

	_, stderr, err = b.billingctl(ctx, "webhooks", "delete", id)
	require.NoError(t, err)
	require.Contains(t, stderr, "deleted")
	_, _, err = b.billingctl(ctx, "webhooks", "delete", id)
	require.ErrorContains(t, err, "not found")
	require.Equal(t, int64(1), count(`SELECT count(*) FROM billing.webhook_deliveries WHERE status = 'canceled'`))
}

func TestWebhooksCreateLimits(t *testing.T) {
	t.Parallel()

	t.Run("AllowedNetworks", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		_, _, err := b.billingctl(ctx, "webhooks", "create", "--url", "https://10.1.2.3/tally", "--events", "*")
		require.ErrorContains(t, err, "--url: 10.1.2.3 is not a public address: it is in 10.0.0.0/8, a private network (RFC 1918)")

		env := b.env
		allow := func(cidrs string) {
			b.env = func(k string) string {
				if k == "TALLY_WEBHOOKS_ALLOW_CIDRS" {
					return cidrs
				}
				return env(k)
			}
		}
		allow("10.0.0.0/8")
		_, stderr, err := b.billingctl(ctx, "webhooks", "create", "--url", "https://10.1.2.3/tally", "--events", "*")
		require.NoError(t, err, stderr)
		allow("10.0.0.0/33")
		_, _, err = b.billingctl(ctx, "webhooks", "list")
		require.ErrorContains(t, err, `TALLY_WEBHOOKS_ALLOW_CIDRS: "10.0.0.0/33" is not a network in CIDR notation`)
	})

	t.Run("EndpointsPerDeployment", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := setup(ctx, t)
		for range ledger.WebhookEndpointsMax {
			_, err := b.ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: "https://93.184.215.14/", Events: []string{"*"}})
			require.NoError(t, err)
		}
		_, _, err := b.billingctl(ctx, "webhooks", "create", "--url", "https://93.184.215.14/tally", "--events", "*")
		require.ErrorContains(t, err, "webhook_endpoints: this deployment has 16 webhook endpoints, the most it may have")
	})
}
