package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// usageCustomer is the customer whose period holds LoadEvents events in
// usage_query.
const usageCustomer = "usage-1"

// usagePlan prices usageMetrics: a graduated price, so the API rates tiers.
const usagePlan = `{"currency":"usd","prices":{` +
	`"m0":{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1"}]},` +
	`"m1":{"model":"per_unit","unit_amount":"0.025"},"m2":{"model":"per_unit","unit_amount":"0.3"},` +
	`"m3":{"model":"package","package_size":"100","unit_amount":"250"}}}`

// usageMetrics is how many metrics usage_query's events spread over.
const usageMetrics = 4

// usageRollupMax bounds the wait for the worker to roll LoadEvents events
// up in usage_query.
const usageRollupMax = 10 * time.Minute

// usageQuery measures GET /v1/customers/{id}/usage on a customer-period of
// LoadEvents events (GitHub issue 24: p99 under 20 ms at 1,000,000), one
// client asking back to back for Duration: on a fresh database and server
// (api,worker), the period opened through the API on a plan of four
// metrics, then LoadEvents events written straight into it (nine in ten a
// quantity of a metric, one in ten pre-priced, spread over the period's
// hours so far), rolled up by the worker, and the answer checked against
// them before the timed window.
func (r *run) usageQuery(ctx context.Context) error {
	return r.record(r.usageQueryRun(ctx))
}

func (r *run) usageQueryRun(ctx context.Context) (*Result, error) {
	fail := func(err error) (*Result, error) { return nil, &phaseError{phase: PhaseUsageQuery, err: err} }
	dbURL, key, err := r.tallyDatabase(ctx, "usage", false)
	if err != nil {
		return nil, err
	}
	srv, err := r.startServer(ctx, "usage", dbURL, "TALLY_ROLES=api,worker",
		"STRIPE_API_KEY=sk_test_bench", "STRIPE_API_BASE=http://127.0.0.1:9") // no charge is due: Stripe is never called
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	api := newAPIClient(srv.url, key, 1)
	defer api.close()
	for _, put := range []struct{ path, body string }{
		{"/v1/plans/usage", usagePlan},
		{"/v1/customers/" + usageCustomer, `{"stripe_customer_id":"cus_usage","currency":"usd","plan_id":"usage"}`},
	} {
		if err := api.do(ctx, http.MethodPut, put.path, []byte(put.body)); err != nil {
			return fail(err)
		}
	}
	if err := api.do(ctx, http.MethodPost, pathEvent,
		[]byte(`{"customer_id":"`+usageCustomer+`","event_id":"open","metric":"m0","quantity":"1"}`)); err != nil {
		return fail(err)
	}

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t0 := time.Now()
	n := r.cfg.LoadEvents - 1 // and the one that opened the period
	if _, err := conn.Exec(ctx, `
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, quantity, metric, occurred_at,
                                  received_at, payload_hash)
SELECT p.customer_id, 'u' || g, p.period,
       CASE WHEN g % 10 = 0 THEN 1 + g % 7 END, p.currency,
       CASE WHEN g % 10 <> 0 THEN round((g % 1000) / 8.0, 3) END,
       CASE WHEN g % 10 <> 0 THEN 'm' || (g % $2) END,
       p.starts_at + make_interval(hours => (g % greatest(1, floor(extract(epoch FROM now() - p.starts_at) / 3600))::bigint)::int),
       now(), sha256(int8send(g))
FROM billing.periods p, generate_series(1, $3) g
WHERE p.customer_id = $1`, usageCustomer, usageMetrics, n); err != nil {
		return fail(fmt.Errorf("error writing %d events: %w", n, err))
	}
	written := time.Since(t0)
	if err := r.checkpoint(ctx); err != nil {
		return nil, err
	}
	t0 = time.Now()
	if err := rollupCaughtUp(ctx, conn, usageRollupMax); err != nil {
		return fail(err)
	}
	rolled := time.Since(t0)
	r.logf("%s: %d events written in %s, rolled up in %s", PhaseUsageQuery, r.cfg.LoadEvents, written.Round(time.Second), rolled.Round(time.Second))

	path := "/v1/customers/" + usageCustomer + "/usage"
	var usage struct {
		usageEvents
		ProjectedCents int64 `json:"projected_cents"`
	}
	if err := api.getJSON(ctx, path, &usage); err != nil {
		return fail(err)
	}
	got := usage.events()
	if got != int64(r.cfg.LoadEvents) || len(usage.Metrics) != usageMetrics {
		return fail(fmt.Errorf("GET %s counts %d events in %d metrics; want %d in %d", path, got, len(usage.Metrics), r.cfg.LoadEvents, usageMetrics))
	}

	lr := closedLoop(ctx, 1, r.cfg.Duration, 0, func(ctx context.Context, _, _ int) (int, error) {
		return 1, api.do(ctx, http.MethodGet, path, nil)
	})
	if err := loopError(PhaseUsageQuery, lr); err != nil {
		return nil, err
	}
	return &Result{Phase: PhaseUsageQuery, Unit: "queries/s", Count: lr.units, Calls: lr.ops, Elapsed: lr.elapsed,
		Latency: newLatency(lr.latencies), Note: fmt.Sprintf(
			"1 client, GET %s of a period of %d events over %d metrics and pre-priced ones (%d cents projected); written in %s, rolled up in %s",
			path, r.cfg.LoadEvents, usageMetrics, usage.ProjectedCents, written.Round(time.Second), rolled.Round(time.Second))}, nil
}

// getJSON GETs path and decodes its 2xx answer into v.
func (c *apiClient) getJSON(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &statusError{method: http.MethodGet, path: path, status: resp.StatusCode, body: string(body)}
	}
	return json.Unmarshal(body, v)
}
