package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
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
	opts := setupOpts{ledger: ledger.Config{WebhooksAllowHTTP: true}}

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
		ctx, b := setup(t, setupOpts{ledger: ledger.Config{WebhooksAllowHTTP: true}, thresholdInterval: 200 * time.Millisecond})
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

func TestWebhookDeliveryClient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ip            string
		allowLoopback bool
		forbidden     bool
	}{
		{"169.254.169.254", false, true}, // cloud metadata
		{"fd00:ec2::254", false, true},   // AWS metadata over IPv6
		{"fe80::1", false, true},
		{"0.0.0.0", false, true},
		{"224.0.0.1", false, true},
		{"127.0.0.1", false, true},
		{"127.0.0.1", true, false},
		{"::1", true, false},
		{"10.1.2.3", false, false}, // a receiver on the private network
		{"93.184.216.34", false, false},
	} {
		require.Equal(t, tc.forbidden, jobs.DeliveryAddressForbidden(net.ParseIP(tc.ip), tc.allowLoopback), tc.ip)
	}

	// The check is on the address dialled: a URL naming a metadata address
	// is refused before any connection, and a redirect is not followed.
	client := jobs.DeliveryClient(time.Second, true)
	resp, err := client.Get("http://169.254.169.254/latest/meta-data/")
	if err == nil {
		require.NoError(t, resp.Body.Close())
	}
	require.ErrorContains(t, err, "refusing to deliver")
	redirect := httptest.NewServer(http.RedirectHandler("http://127.0.0.1:1/elsewhere", http.StatusFound))
	t.Cleanup(redirect.Close)
	resp, err = client.Get(redirect.URL)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusFound, resp.StatusCode)
}

func TestWebhookDeliveryExcerpt(t *testing.T) {
	t.Parallel()
	// What Postgres's text takes: no NUL, no invalid UTF-8, no character
	// cut in half by the excerpt's limit.
	require.Equal(t, "okdone", jobs.TextExcerpt([]byte("ok\x00done")))
	require.Equal(t, "caf", jobs.TextExcerpt([]byte("caf\xc3")))
	require.Equal(t, "café", jobs.TextExcerpt([]byte("café")))
}
