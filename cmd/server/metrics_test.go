package main

import (
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/testdb"
	"github.com/tally-billing/tally/internal/tools/testtool"
)

const metricsToken = "metrics-token-0123456789"

// scrape GETs url with an optional bearer token and returns the status and
// body.
func scrape(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// sample returns the value of the series of name whose labels include
// labels, from metrics in the text format (parsed by Prometheus' own
// parser), or fails.
func sample(t *testing.T, families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f, ok := families[name]
	require.True(t, ok, "no metric %s", name)
	for _, m := range f.GetMetric() {
		match := true
		for k, v := range labels {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	require.FailNow(t, "no series", "%s%v", name, labels)
	return 0
}

// The metrics a replica counts itself: served on TALLY_METRICS_ADDR, and on
// the API behind TALLY_METRICS_TOKEN; counted per route pattern and per
// usage-event result; valid for Prometheus' parser and promtool.
func TestMetrics(t *testing.T) {
	ctx := t.Context()
	pool, databaseURL := testdb.New(t)
	metricsAddr := freeAddr(t)
	b := setupEnv(ctx, t, databaseURL, map[string]string{
		"TALLY_METRICS_ADDR": metricsAddr, "TALLY_METRICS_TOKEN": metricsToken, "TALLY_METRICS_STATE_INTERVAL": "1ms",
	})
	b.waitStatus(t, "/readyz", http.StatusOK)

	l, err := ledger.New(pool, ledger.Config{})
	require.NoError(t, err)
	secret, _, err := l.APIKeyCreate(ctx, "metrics", ledger.Scopes)
	require.NoError(t, err)
	status, _, body := b.call(t, secret, http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd"}`)
	require.Equal(t, http.StatusCreated, status, "body: %s", body)

	post := func(path, body string, want int) {
		t.Helper()
		status, _, got := b.call(t, secret, http.MethodPost, path, body)
		require.Equal(t, want, status, "body: %s", got)
	}
	post("/v1/usage-events", `{"customer_id":"acme","event_id":"e1","amount_cents":100}`, http.StatusCreated)
	post("/v1/usage-events", `{"customer_id":"acme","event_id":"e1","amount_cents":100}`, http.StatusOK)
	post("/v1/usage-events", `{"customer_id":"acme","event_id":"e1","amount_cents":999}`, http.StatusConflict)
	post("/v1/usage-events", `{"customer_id":"acme","event_id":"e2"}`, http.StatusUnprocessableEntity)
	post("/v1/usage-events/batch", `{"events":[{"customer_id":"acme","event_id":"b1","amount_cents":1},`+
		`{"customer_id":"acme","event_id":"b2","amount_cents":2},{"customer_id":"acme","event_id":"e1","amount_cents":100}]}`, http.StatusCreated)
	post("/v1/usage-events/batch", `{"events":[{"customer_id":"acme","event_id":"b3","amount_cents":1},`+
		`{"customer_id":"acme","event_id":"b4","amount_cents":-2}]}`, http.StatusUnprocessableEntity)
	status, _, _ = b.call(t, secret, http.MethodGet, "/v1/customers/nobody", "")
	require.Equal(t, http.StatusNotFound, status)

	// The API serves them only with the token.
	status, _ = scrape(t, b.baseURL+"/metrics", "")
	require.Equal(t, http.StatusUnauthorized, status)
	status, _ = scrape(t, b.baseURL+"/metrics", "wrong-token-0123456789")
	require.Equal(t, http.StatusUnauthorized, status)
	status, viaAPI := scrape(t, b.baseURL+"/metrics", metricsToken)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, viaAPI, "tally_usage_events_total")

	status, text := scrape(t, "http://"+metricsAddr+"/metrics", "")
	require.Equal(t, http.StatusOK, status)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err, "Prometheus' parser refuses the output")

	for result, want := range map[string]float64{"created": 3, "replayed": 2, "conflict": 1, "rejected": 3} {
		require.Equal(t, want, sample(t, families, "tally_usage_events_total", map[string]string{"result": result}), "result %s", result)
	}
	require.Equal(t, 2.0, sample(t, families, "tally_usage_event_batch_size", nil), "two batches observed")
	require.Equal(t, 2.0, sample(t, families, "tally_http_requests_total",
		map[string]string{"route": "POST /v1/usage-events", "method": "POST", "code": "2xx"}))
	require.Equal(t, 2.0, sample(t, families, "tally_http_requests_total",
		map[string]string{"route": "POST /v1/usage-events", "method": "POST", "code": "4xx"}))
	require.Equal(t, 1.0, sample(t, families, "tally_http_requests_total",
		map[string]string{"route": "GET /v1/customers/{customer_id}", "code": "4xx"}), "labelled by pattern, not path")
	require.Equal(t, 4.0, sample(t, families, "tally_http_request_duration_seconds",
		map[string]string{"route": "POST /v1/usage-events"}))
	// The state gauges, read from Postgres: the customer's period is open,
	// nothing is in flight yet. A held charge and a paused switch:
	require.Equal(t, 0.0, sample(t, families, "tally_charges", map[string]string{"status": "pending"}))
	require.Equal(t, 0.0, sample(t, families, "tally_charging_paused", nil))
	require.Equal(t, 1.0, sample(t, families, "tally_river_jobs", map[string]string{"queue": "charges", "state": "scheduled"}),
		"the period's charge job, scheduled at its close")
	_, err = pool.Exec(ctx, `
INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at)
VALUES ('held-co', 'cus_held', 'usd', now(), now());
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, status, closed_at, created_at)
VALUES ('held-co', '2026-01-01', 'usd', '2026-01-01', '2026-01-02', now() - interval '90 seconds', 'open', NULL, now());
INSERT INTO billing.charges (customer_id, period, status, amount_cents, currency, event_count, stripe_customer_id,
                             charge_key, idempotency_key, period_starts_at, held_reason, held_detail, held_at, created_at, updated_at)
VALUES ('held-co', '2026-01-01', 'held', 100, 'usd', 1, 'cus_held', 'k:held', 'i:held', '2026-01-01',
        'over_customer_cap', 'test', now(), now() - interval '1 hour', now())`)
	require.NoError(t, err)
	status, _, body = b.call(t, secret, http.MethodPost, "/v1/admin/charging/pause", `{"reason":"metrics test"}`)
	require.Equal(t, http.StatusOK, status, "body: %s", body)
	_, text = scrape(t, "http://"+metricsAddr+"/metrics", "")
	families, err = parser.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err)
	require.Equal(t, 1.0, sample(t, families, "tally_charges", map[string]string{"status": "held"}))
	require.Equal(t, 1.0, sample(t, families, "tally_charges_held", map[string]string{"reason": "over_customer_cap"}))
	require.Equal(t, 1.0, sample(t, families, "tally_charging_paused", nil))
	require.GreaterOrEqual(t, sample(t, families, "tally_period_close_overdue_seconds", nil), 90.0)

	// The replica's roles, for the alerts that fire when every replica of
	// one is gone: this one runs the API only.
	require.Equal(t, 1.0, sample(t, families, "tally_replica_role", map[string]string{"role": "api"}))
	require.Len(t, families["tally_replica_role"].GetMetric(), 1, "no worker role")

	require.Contains(t, families, "go_goroutines")
	require.Contains(t, families, "process_resident_memory_bytes")
	require.NotContains(t, text, secret, "no secret in the metrics")

	cmd := exec.Command(testtool.Bin(t, "PROMTOOL_BIN", "promtool"), "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics:\n%s", out)
}

// TestMetricsListenerToken: a metrics listener on every interface (as in a
// pod, scraped from outside) answers only with TALLY_METRICS_TOKEN; one on
// loopback stays open to an agent on the host (TestMetrics).
func TestMetricsListenerToken(t *testing.T) {
	ctx := t.Context()
	_, databaseURL := testdb.New(t)
	_, port, err := net.SplitHostPort(freeAddr(t))
	require.NoError(t, err)
	b := setupEnv(ctx, t, databaseURL, map[string]string{
		"TALLY_METRICS_ADDR": ":" + port, "TALLY_METRICS_TOKEN": metricsToken,
	})
	b.waitStatus(t, "/readyz", http.StatusOK)

	url := "http://127.0.0.1:" + port + "/metrics"
	status, body := scrape(t, url, "")
	require.Equal(t, http.StatusUnauthorized, status, "body: %s", body)
	require.NotContains(t, body, "tally_")
	status, _ = scrape(t, url, "wrong-token-0123456789")
	require.Equal(t, http.StatusUnauthorized, status)
	status, body = scrape(t, url, metricsToken)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "tally_http_requests_total")
}

// TestMetricsWorkerRole: a worker-only replica, which serves no API,
// exports its role on the metrics listener once its workers have started.
func TestMetricsWorkerRole(t *testing.T) {
	ctx := t.Context()
	_, databaseURL := testdb.New(t)
	metricsAddr := freeAddr(t)
	setupEnv(ctx, t, databaseURL, map[string]string{
		"TALLY_ROLES": "worker", "TALLY_METRICS_ADDR": metricsAddr,
		"STRIPE_API_KEY": "rk_test_metrics", "STRIPE_API_BASE": "http://" + freeAddr(t), "TALLY_WORKERS": "1",
	})

	url := "http://" + metricsAddr + "/metrics"
	deadline := time.Now().Add(readyWaitMax)
	var text string
	for !strings.Contains(text, "tally_replica_role") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		resp, err := http.Get(url)
		if err != nil {
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		text = string(body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err, "%s", text)
	require.Equal(t, 1.0, sample(t, families, "tally_replica_role", map[string]string{"role": "worker"}))
	require.Len(t, families["tally_replica_role"].GetMetric(), 1, "no API role")
}
