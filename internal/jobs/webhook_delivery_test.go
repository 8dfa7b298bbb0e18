package jobs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
	"github.com/tally-billing/tally/internal/webhook"
)

// receiver is a producer's webhook endpoint: it verifies each delivery's
// signature with the endpoint's secret, records what it took, and fails the
// first failFirst deliveries with a 503.
type receiver struct {
	mu        sync.Mutex
	secret    string
	failFirst int
	tries     int
	got       []ledger.NotificationBody
	ids       []string // Tally-Notification-Id of every try
	refused   []string // why a try's signature did not verify
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tries++
	r.ids = append(r.ids, req.Header.Get("Tally-Notification-Id"))
	if err := webhook.Verify(body, req.Header.Get(webhook.SignatureHeader), r.secret, webhook.DefaultTolerance, time.Now()); err != nil {
		r.refused = append(r.refused, err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.tries <= r.failFirst {
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	var n ledger.NotificationBody
	if err := json.Unmarshal(body, &n); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.got = append(r.got, n)
	_, _ = io.WriteString(w, "ok")
}

func (r *receiver) delivered() []ledger.NotificationBody {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ledger.NotificationBody(nil), r.got...)
}

// endpoint registers a receiver failing its first failFirst tries for
// events and returns it.
func (b *testBundle) endpoint(t *testing.T, ctx context.Context, failFirst int, events ...string) *receiver {
	t.Helper()
	r := &receiver{failFirst: failFirst}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	e, err := b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: srv.URL + "/hooks", Events: events})
	require.NoError(t, err)
	r.secret = e.Secret
	return r
}

func TestWebhookDelivery(t *testing.T) {
	t.Parallel()
	opts := setupOpts{ledger: ledger.Config{WebhooksAllow: webhook.LoopbackNetworks()}}

	t.Run("RetriedUntilTakenThenLogged", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		r := b.endpoint(t, ctx, 2, ledger.NotifyChargeSucceeded, ledger.NotifyPeriodClosed)
		b.customerWithEvents(t, ctx, "acme", 700)
		b.closeNow(t, ctx, "acme")
		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))

		require.Eventually(t, func() bool { return len(r.delivered()) == 2 }, waitTimeout, 20*time.Millisecond)
		got := r.delivered()
		types := map[string]ledger.NotificationBody{}
		for _, n := range got {
			types[n.Type] = n
		}
		require.Contains(t, types, ledger.NotifyPeriodClosed)
		n := types[ledger.NotifyChargeSucceeded]
		require.Equal(t, ledger.NotificationAPIVersion, n.APIVersion)
		var charge ledger.PublicCharge
		require.NoError(t, json.Unmarshal(n.Data.Object, &charge))
		require.Equal(t, c.ID, charge.ID)
		require.Equal(t, "succeeded", charge.Status)
		require.Equal(t, int64(700), charge.AmountCents)
		require.Equal(t, c.StripePaymentIntentID, charge.StripePaymentIntentID)

		// Two 503s, then taken: each try logged, with the same
		// notification id on every try of a delivery.
		r.mu.Lock()
		require.Empty(t, r.refused)
		require.Equal(t, 4, r.tries)
		require.ElementsMatch(t, []string{got[0].ID, got[1].ID}, slices.Compact(slices.Sorted(slices.Values(r.ids))))
		r.mu.Unlock()
		require.Eventually(t, func() bool { // the last attempt is recorded after its answer
			return b.Count(t, `SELECT count(*) FROM billing.webhook_deliveries WHERE status = 'delivered'`) == 2
		}, waitTimeout, 20*time.Millisecond)
		require.Equal(t, int64(4), b.Count(t, `SELECT count(*) FROM billing.webhook_attempts`))
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.webhook_attempts WHERE status_code = 503 AND error = 'answered 503 Service Unavailable'`))
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.webhook_attempts WHERE status_code = 200 AND response_excerpt = 'ok'`))
	})

	t.Run("RotatedSecretBothSign", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		old := b.endpoint(t, ctx, 0, ledger.NotifyPeriodClosed)
		eps, err := b.Ledger.WebhookEndpointList(ctx)
		require.NoError(t, err)
		rotated, err := b.Ledger.WebhookEndpointRotateSecret(ctx, eps[0].ID, time.Hour)
		require.NoError(t, err)
		require.NotEqual(t, old.secret, rotated.Secret)

		// A receiver still on the old secret takes the delivery during the
		// grace period: the old secret signs beside the new one.
		b.customerWithEvents(t, ctx, "acme", 700)
		b.closeNow(t, ctx, "acme")
		require.Eventually(t, func() bool { return len(old.delivered()) == 1 }, waitTimeout, 20*time.Millisecond)
	})

	t.Run("UsageThresholdReached", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{ledger: ledger.Config{WebhooksAllow: webhook.LoopbackNetworks()}, rollupInterval: 200 * time.Millisecond})
		r := b.endpoint(t, ctx, 0, ledger.NotifyUsageThreshold)
		_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd",
			UsageAlertThresholdsCents: []int64{1000}})
		require.NoError(t, err)
		for i, amount := range []int64{400, 400, 400} {
			_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: fmt.Sprint("e", i), AmountCents: amount})
			require.NoError(t, err)
		}
		require.Eventually(t, func() bool { return len(r.delivered()) == 1 }, waitTimeout, 20*time.Millisecond)
		var th ledger.PublicThreshold
		require.NoError(t, json.Unmarshal(r.delivered()[0].Data.Object, &th))
		require.Equal(t, int64(1000), th.ThresholdCents)
		require.Equal(t, int64(1200), th.TotalCents)
	})
}

// recordingDial stands for the network in delivery tests: it records the
// addresses a delivery would connect to, and connects to none.
type recordingDial struct {
	mu     sync.Mutex
	dialed []string
}

var errNotDialed = errors.New("not dialled: recorded by the test")

func (r *recordingDial) dial(_ context.Context, _, address string) (net.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dialed = append(r.dialed, address)
	return nil, errNotDialed
}

func (r *recordingDial) addresses() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.dialed...)
}

func TestWebhookDeliveryClient(t *testing.T) {
	t.Parallel()

	t.Run("AllowedNetworkDialled", func(t *testing.T) {
		t.Parallel()
		rec := &recordingDial{}
		allow := webhook.AddressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}}
		dialer := jobs.NewRecordingDeliveryDialer(allow, ledgertest.NewResolver(), rec.dial)
		for _, addr := range []string{"10.20.3.4", "10.21.0.1", "192.168.1.1"} {
			_, err := dialer.DialContext(t.Context(), "tcp", net.JoinHostPort(addr, "443"))
			require.Error(t, err)
		}
		require.Equal(t, []string{"10.20.3.4:443"}, rec.addresses())
	})

	t.Run("NoProxyNoRedirect", func(t *testing.T) {
		t.Parallel()
		// No proxy from the environment: the address checked is the one
		// the request goes to.
		client := jobs.DeliveryClient(time.Second, jobs.NewDeliveryDialer(webhook.AddressPolicy{Allow: webhook.LoopbackNetworks()}, time.Second))
		require.Nil(t, client.Transport.(*http.Transport).Proxy)

		// A redirect is not followed: it is the answer.
		redirect := httptest.NewServer(http.RedirectHandler("http://127.0.0.1:1/elsewhere", http.StatusFound))
		t.Cleanup(redirect.Close)
		resp, err := client.Get(redirect.URL)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusFound, resp.StatusCode)
	})

	t.Run("NonPublicRefusedBeforeDialling", func(t *testing.T) {
		t.Parallel()
		rec := &recordingDial{}
		resolver := ledgertest.NewResolver()
		dialer := jobs.NewRecordingDeliveryDialer(webhook.AddressPolicy{}, resolver, rec.dial)
		for _, addr := range []string{
			"10.0.0.1", "10.255.0.9", "100.64.0.1", "100.100.100.200", "172.16.0.1", "172.31.9.9", "192.168.1.1",
			"127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.1", "255.255.255.255", "198.18.0.1", "192.0.2.1",
			"::1", "::", "fe80::1", "fc00::1", "fd00:ec2::254", "::ffff:10.0.0.1", "::ffff:169.254.169.254",
			"64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "2002:c0a8:101::1", "2001:db8::1", "ff02::1",
		} {
			_, err := dialer.DialContext(t.Context(), "tcp", net.JoinHostPort(addr, "443"))
			require.ErrorContains(t, err, "is not a public address", addr)
			var e *webhook.AddressError
			require.ErrorAs(t, err, &e, addr)
		}
		resolver.Set("metadata.example", netip.MustParseAddr("169.254.169.254"))
		_, err := dialer.DialContext(t.Context(), "tcp", "metadata.example:443")
		require.ErrorContains(t, err, "refusing to deliver to metadata.example: 169.254.169.254 is not a public address")
		require.Empty(t, rec.addresses(), "nothing dialled")

		// The socket's own check, for any address a dial reaches.
		require.ErrorContains(t, jobs.DeliveryAddressCheck(webhook.AddressPolicy{}, "10.0.0.1:443"), "10.0.0.1 is not a public address")
		require.ErrorContains(t, jobs.DeliveryAddressCheck(webhook.AddressPolicy{}, "[::ffff:a9fe:a9fe]:80"), "169.254.169.254 is not a public address")
		require.NoError(t, jobs.DeliveryAddressCheck(webhook.AddressPolicy{}, "93.184.215.14:443"))
	})

	t.Run("PublicDialled", func(t *testing.T) {
		t.Parallel()
		rec := &recordingDial{}
		resolver := ledgertest.NewResolver()
		resolver.Set("mapped.example", netip.MustParseAddr("::ffff:93.184.215.14"))
		resolver.Set("mixed.example", netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("2606:2800:21f:cb07:6820:80da:af6b:8b2c"))
		dialer := jobs.NewRecordingDeliveryDialer(webhook.AddressPolicy{}, resolver, rec.dial)
		for _, address := range []string{"93.184.215.14:443", "[2a00:1450:4001:80b::200e]:443", "[64:ff9b::5db8:d70e]:443",
			"example.com:8443", "mapped.example:443", "mixed.example:443"} {
			_, err := dialer.DialContext(t.Context(), "tcp", address)
			require.ErrorIs(t, err, errNotDialed, address)
		}
		require.Equal(t, []string{"93.184.215.14:443", "[2a00:1450:4001:80b::200e]:443", "[64:ff9b::5db8:d70e]:443",
			"93.184.215.14:8443", "93.184.215.14:443", "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443"}, rec.addresses())
	})
}

// TestWebhookDeliveryRefused delivers to an endpoint whose host resolved to
// a public address when it was created and resolves to a private one at
// delivery (DNS rebinding): each attempt is refused as it dials, logged with
// the reason, and the endpoint ends disabled like any that always fails.
func TestWebhookDeliveryRefused(t *testing.T) {
	t.Parallel()

	// setup returns a ledger whose endpoint rebind.example was created while
	// it resolved to a public address, with one delivery to it, and a
	// delivery worker dialling through rec under allow.
	setup := func(t *testing.T, allow ...netip.Prefix) (context.Context, *ledgertest.Bundle, *jobs.WebhookDeliveryWorker, *recordingDial, *bytes.Buffer, int64) {
		ctx := t.Context()
		b := ledgertest.New(t, ledger.Config{})
		b.Resolver.Set("rebind.example", ledgertest.ExampleAddr)
		_, err := b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: "https://rebind.example/tally", Events: []string{"*"}})
		require.NoError(t, err)
		var deliveryID int64
		require.NoError(t, b.Pool.QueryRow(ctx, `
WITH n AS (INSERT INTO billing.notifications (id, customer_id, type, body, created_at)
           VALUES ('ntf_1', 'acme', 'period.closed', '{}', now()) RETURNING id, customer_id)
INSERT INTO billing.webhook_deliveries (notification_id, customer_id, endpoint_id, created_at, updated_at)
SELECT n.id, n.customer_id, e.id, now(), now() FROM n, billing.webhook_endpoints e RETURNING id`).Scan(&deliveryID))
		b.Resolver.Set("rebind.example", netip.MustParseAddr("10.0.0.7"))

		rec := &recordingDial{}
		var logs bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&logs, nil))
		w := jobs.NewWebhookDeliveryWorker(b.Ledger, logger, jobs.NewRecordingDeliveryDialer(webhook.AddressPolicy{Allow: allow}, b.Resolver, rec.dial))
		return ctx, b, w, rec, &logs, deliveryID
	}
	attempt := func(n int, deliveryID int64) *river.Job[jobs.WebhookDeliveryArgs] {
		return &river.Job[jobs.WebhookDeliveryArgs]{JobRow: &rivertype.JobRow{Attempt: n, MaxAttempts: 72},
			Args: jobs.WebhookDeliveryArgs{DeliveryID: deliveryID}}
	}

	t.Run("AllowedNetworkDialled", func(t *testing.T) {
		t.Parallel()
		ctx, b, w, rec, _, id := setup(t, netip.MustParsePrefix("10.0.0.0/8"))
		require.ErrorContains(t, w.Work(ctx, attempt(1, id)), "not dialled")
		require.Equal(t, []string{"10.0.0.7:443"}, rec.addresses())
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.webhook_attempts WHERE error LIKE '%not dialled: recorded by the test%'`))
	})

	t.Run("RefusedAtDialUntilDisabled", func(t *testing.T) {
		t.Parallel()
		ctx, b, w, rec, logs, id := setup(t)
		require.ErrorContains(t, w.Work(ctx, attempt(1, id)), "refusing to deliver to rebind.example: 10.0.0.7 is not a public address")
		require.Empty(t, rec.addresses(), "nothing dialled")
		var why string
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT error FROM billing.webhook_attempts WHERE delivery_id = $1`, id).Scan(&why))
		require.Equal(t, `Post "https://rebind.example/tally": refusing to deliver to rebind.example: 10.0.0.7 is not a public address: `+
			`it is in 10.0.0.0/8, a private network (RFC 1918); webhooks go only to public addresses unless TALLY_WEBHOOKS_ALLOW_CIDRS allows its network`, why)

		// The last attempt fails the delivery and, nothing delivered since,
		// disables the endpoint with its alert.
		require.NoError(t, w.Work(ctx, attempt(72, id)))
		require.Empty(t, rec.addresses(), "nothing dialled")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.webhook_deliveries WHERE status = 'failed'`))
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.webhook_endpoints
WHERE disabled_at IS NOT NULL AND disabled_reason LIKE '%10.0.0.7 is not a public address%'`))
		require.Contains(t, logs.String(), `"alert":"webhook_endpoint_disabled"`)
		require.Contains(t, logs.String(), `"alert":"webhook_delivery_failed"`)
	})
}

func TestWebhookDeliveryExcerpt(t *testing.T) {
	t.Parallel()
	// What Postgres's text takes: no NUL, no invalid UTF-8, no character
	// cut in half by the excerpt's limit.
	require.Equal(t, "okdone", jobs.TextExcerpt([]byte("ok\x00done")))
	require.Equal(t, "caf", jobs.TextExcerpt([]byte("caf\xc3")))
	require.Equal(t, "café", jobs.TextExcerpt([]byte("café")))
}
