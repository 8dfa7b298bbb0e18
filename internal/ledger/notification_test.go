package ledger_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/webhook"
)

// subscribe registers an endpoint for events and returns its id.
func (b *testBundle) subscribe(t *testing.T, ctx context.Context, events ...string) int64 {
	t.Helper()
	e, err := b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: "https://example.com/hooks", Events: events})
	require.NoError(t, err)
	return e.ID
}

// notifications returns the types of the notifications written, in order.
func (b *testBundle) notifications(t *testing.T, ctx context.Context) []string {
	t.Helper()
	rows, err := b.Pool.Query(ctx, `SELECT type FROM billing.notifications ORDER BY created_at, type`)
	require.NoError(t, err)
	var types []string
	for rows.Next() {
		var typ string
		require.NoError(t, rows.Scan(&typ))
		types = append(types, typ)
	}
	require.NoError(t, rows.Err())
	return types
}

// settle claims and records outcome o on acme's November charge.
func (b *testBundle) settle(t *testing.T, ctx context.Context, o ledger.Outcome) *ledger.Charge {
	t.Helper()
	cc, err := b.closeClaim(ctx, "w", "", true)
	require.NoError(t, err)
	claim, err := b.Ledger.ChargeLookupNone(ctx, cc.Claim, "job:1/1")
	require.NoError(t, err)
	c, err := b.Ledger.ChargeRecordOutcome(ctx, claim, o, "job:1/1", nil)
	require.NoError(t, err)
	return c
}

func TestNotification(t *testing.T) {
	t.Parallel()
	succeeded := ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_1"}

	t.Run("DeletedEndpointGetsNothing", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		require.NoError(t, b.Ledger.WebhookEndpointDelete(ctx, b.subscribe(t, ctx, ledger.NotifyAll)))
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		b.settle(t, ctx, succeeded)
		require.Empty(t, b.notifications(t, ctx))
	})

	t.Run("DisabledEndpointGetsFailedDeliveries", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		id := b.subscribe(t, ctx, ledger.NotifyAll)
		_, err := b.Pool.Exec(ctx, `UPDATE billing.webhook_endpoints SET disabled_at = now() WHERE id = $1`, id)
		require.NoError(t, err)
		_, err = b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		b.settle(t, ctx, succeeded)

		// Written, failed and unsent, for a redelivery once it is enabled.
		require.Len(t, b.notifications(t, ctx), 2)
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.webhook_deliveries WHERE status = 'failed'`))
		require.Zero(t, b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'webhook_delivery'`))
		_, err = b.Ledger.WebhookEndpointEnable(ctx, id)
		require.NoError(t, err)
		n, err := b.Ledger.WebhookRedeliver(ctx, ledger.WebhookRedeliverParams{EndpointID: id})
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'webhook_delivery'`))
	})

	t.Run("NoEndpointNoNotification", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		b.settle(t, ctx, succeeded)
		require.Empty(t, b.notifications(t, ctx))
	})

	t.Run("SavepointRolledBackNotifiesNothing", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.subscribe(t, ctx, ledger.NotifyPeriodClosed)
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		p := ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "test"}

		require.NoError(t, b.Ledger.PeriodCloseInSavepoint(ctx, p, true))
		require.Empty(t, b.notifications(t, ctx), "the close was rolled back with its savepoint")
		require.NoError(t, b.Ledger.PeriodCloseInSavepoint(ctx, p, false))
		require.Equal(t, []string{ledger.NotifyPeriodClosed}, b.notifications(t, ctx))
	})

	t.Run("WrittenWithTheChange", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		all := b.subscribe(t, ctx, ledger.NotifyAll)
		failedOnly := b.subscribe(t, ctx, ledger.NotifyChargeFailed)
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		c := b.settle(t, ctx, succeeded)

		// The close and the success, each once, to the endpoint subscribed
		// to all; nothing to the one that wants failures only.
		require.ElementsMatch(t, []string{ledger.NotifyPeriodClosed, ledger.NotifyChargeSucceeded}, b.notifications(t, ctx))
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.webhook_deliveries WHERE endpoint_id = $1 AND status = 'pending'`, all))
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.webhook_deliveries WHERE endpoint_id = $1`, failedOnly))
		require.Equal(t, int64(2), b.Count(t, `
SELECT count(*) FROM river.river_job j JOIN billing.webhook_deliveries d ON d.id = (j.args->>'delivery_id')::bigint
WHERE j.kind = 'webhook_delivery' AND j.queue = 'webhook_deliveries'`))

		// The body carries the charge as the API shows it, as the change
		// left it.
		var raw []byte
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT body FROM billing.notifications WHERE type = 'charge.succeeded'`).Scan(&raw))
		var n ledger.NotificationBody
		require.NoError(t, json.Unmarshal(raw, &n))
		require.Regexp(t, `^ntf_[0-9a-f]{24}$`, n.ID)
		require.Equal(t, ledger.NotificationAPIVersion, n.APIVersion)
		require.Equal(t, b.Clock.Now().UTC(), n.CreatedAt.UTC())
		var charge ledger.PublicCharge
		require.NoError(t, json.Unmarshal(n.Data.Object, &charge))
		require.Equal(t, c.Public().Status, charge.Status)
		require.Equal(t, "pi_1", *charge.StripePaymentIntentID)
		require.Equal(t, c.ID, charge.ID)
	})
}

func TestWebhookEndpoint(t *testing.T) {
	t.Parallel()

	t.Run("DeleteCancelsPendingDeliveries", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		id := b.subscribe(t, ctx, ledger.NotifyPeriodClosed)
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		b.close(t, ctx)
		require.NoError(t, b.Ledger.WebhookEndpointDelete(ctx, id))
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.webhook_deliveries WHERE status = 'canceled'`))
		require.ErrorIs(t, b.Ledger.WebhookEndpointDelete(ctx, id), ledger.ErrNotFound)
		list, err := b.Ledger.WebhookEndpointList(ctx)
		require.NoError(t, err)
		require.Empty(t, list)
	})

	t.Run("FailingForDaysIsDisabled", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		id := b.subscribe(t, ctx, ledger.NotifyAll)
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		b.settle(t, ctx, ledger.Outcome{Class: ledger.OutcomeFailed, ErrorCode: "card_declined"}) // period.closed, charge.failed
		var first, second int64
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT min(id), max(id) FROM billing.webhook_deliveries`).Scan(&first, &second))
		attempt := func(delivery int64, code int, last bool) ledger.AttemptRecorded {
			t.Helper()
			rec, err := b.Ledger.WebhookAttemptRecord(ctx, ledger.WebhookAttempt{DeliveryID: delivery, StartedAt: b.Clock.Now(),
				StatusCode: code, Error: "answered 503", Last: last})
			require.NoError(t, err)
			return rec
		}

		require.Equal(t, ledger.AttemptRecorded{Status: ledger.DeliveryPending}, attempt(first, 503, false))
		// The second delivery got through after the first was written: the
		// endpoint works, and the first's failure does not disable it.
		require.Equal(t, ledger.AttemptRecorded{Status: ledger.DeliveryDelivered}, attempt(second, 200, false))
		require.Equal(t, ledger.AttemptRecorded{Status: ledger.DeliveryFailed}, attempt(first, 503, true))
		list, err := b.Ledger.WebhookEndpointList(ctx)
		require.NoError(t, err)
		require.Nil(t, list[0].DisabledAt)

		// Nothing delivered since: disabled, and sent nothing more.
		_, err = b.Pool.Exec(ctx, `UPDATE billing.webhook_deliveries SET status = 'pending', delivered_at = NULL`)
		require.NoError(t, err)
		require.Equal(t, ledger.AttemptRecorded{Status: ledger.DeliveryFailed, Disabled: true}, attempt(second, 0, true))
		list, err = b.Ledger.WebhookEndpointList(ctx)
		require.NoError(t, err)
		require.NotNil(t, list[0].DisabledAt)
		require.Contains(t, *list[0].DisabledReason, "failed every attempt")
		require.Equal(t, ledger.AttemptRecorded{Status: ledger.DeliveryFailed}, attempt(first, 0, true), "alerted once")
		e, err := b.Ledger.WebhookEndpointEnable(ctx, id)
		require.NoError(t, err)
		require.Nil(t, e.DisabledAt)
	})

	t.Run("RotateKeepsThePreviousSecretForTheGrace", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		e, err := b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: "https://example.com/h", Events: []string{"*"}})
		require.NoError(t, err)
		require.Regexp(t, `^whsec_`, e.Secret)
		rotated, err := b.Ledger.WebhookEndpointRotateSecret(ctx, e.ID, time.Hour)
		require.NoError(t, err)
		now := b.Clock.Now()
		require.Equal(t, []string{rotated.Secret, e.Secret}, rotated.SigningSecrets(now))
		require.Equal(t, []string{rotated.Secret}, rotated.SigningSecrets(now.Add(time.Hour)))
		_, err = b.Ledger.WebhookEndpointRotateSecret(ctx, 999, time.Hour)
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})

	t.Run("Validation", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			allow  []netip.Prefix
			url    string
			events []string
			field  string
		}{
			{nil, "http://127.0.0.1:8080/h", []string{"*"}, "url"},
			{webhook.LoopbackNetworks(), "http://10.0.0.1/h", []string{"*"}, "url"},
			{nil, "https://user:pw@example.com/h", []string{"*"}, "url"},
			{nil, "example.com/h", []string{"*"}, "url"},
			{nil, "https://:443/h", []string{"*"}, "url"},
			{nil, "", []string{"*"}, "url"},
			{nil, "https://example.com/h", nil, "events"},
			{nil, "https://example.com/h", []string{"charge.paid"}, "events"},
		} {
			ctx, b := setup(t, setupOpts{ledger: ledger.Config{WebhooksAllow: tc.allow}})
			_, err := b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: tc.url, Events: tc.events})
			requireInvalid(t, err, tc.field)
		}
		ctx, b := setup(t, setupOpts{ledger: ledger.Config{WebhooksAllow: webhook.LoopbackNetworks()}})
		_, err := b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: "http://localhost:9/h", Events: []string{"period.closed"}})
		require.NoError(t, err)
	})
}
