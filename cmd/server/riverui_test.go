package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/testdb"
	"github.com/tally-billing/tally/internal/tools/testtool"
)

// basicAnswer is the status and headers of an answer getBasic read.
type basicAnswer struct {
	StatusCode int
	Header     http.Header
}

// getBasic GETs url with basic auth (user, password) when password is set,
// and returns the answer and its body.
func getBasic(t *testing.T, url, password string) (basicAnswer, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if password != "" {
		req.SetBasicAuth("ops", password)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return basicAnswer{StatusCode: resp.StatusCode, Header: resp.Header}, string(body)
}

// sendBasic sends method url with basic auth (any user, password), body and
// header, and returns the status and body of the answer.
func sendBasic(t *testing.T, method, url, password, body string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.SetBasicAuth("ops", password)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(out)
}

// River's own UI at /riverui/: only for admin keys (basic auth, as a browser
// sends it), in a real browser it lists the charge jobs, it changes state
// only for its own pages, and it does not pause or resume Tally's queues.
func TestRiverUI(t *testing.T) {
	ctx := t.Context()
	pool, databaseURL := testdb.New(t)
	b := setupEnv(ctx, t, databaseURL, map[string]string{
		"TALLY_METRICS_TOKEN": metricsToken, "TALLY_METRICS_STATE_INTERVAL": "1ms",
	})
	b.waitStatus(t, "/readyz", http.StatusOK)

	l, err := ledger.New(pool, ledger.Config{})
	require.NoError(t, err)
	admin, _, err := l.APIKeyCreate(ctx, "ops", []ledger.Scope{ledger.ScopeAdmin})
	require.NoError(t, err)
	writer, _, err := l.APIKeyCreate(ctx, "producer", []ledger.Scope{ledger.ScopeUsageWrite, ledger.ScopeCustomersWrite})
	require.NoError(t, err)
	status, _, body := b.call(t, writer, http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd"}`)
	require.Equal(t, http.StatusCreated, status, "body: %s", body)
	status, _, body = b.call(t, writer, http.MethodPost, "/v1/usage-events", `{"customer_id":"acme","event_id":"e1","amount_cents":100}`)
	require.Equal(t, http.StatusCreated, status, "body: %s", body) // its period's charge job is scheduled

	t.Run("Auth", func(t *testing.T) {
		resp, _ := getBasic(t, b.baseURL+"/riverui/", "")
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic realm=")
		resp, _ = getBasic(t, b.baseURL+"/riverui/api/jobs?state=scheduled", "")
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "nothing of the UI's API answers without a key")
		resp, _ = getBasic(t, b.baseURL+"/riverui/", "tly_not_a_key")
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		resp, _ = getBasic(t, b.baseURL+"/riverui/", writer)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "a key without the admin scope")

		resp, page := getBasic(t, b.baseURL+"/riverui/", admin)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Contains(t, page, "<html")
		resp, jobs := getBasic(t, b.baseURL+"/riverui/api/jobs?state=scheduled", admin)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Contains(t, jobs, `"charge_period"`)

		// The login link goes on to a page of the UI only, never elsewhere.
		noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		for next, want := range map[string]string{
			"/riverui/jobs?state=running": b.baseURL + "/riverui/jobs?state=running",
			"https://evil.example/":       b.baseURL + "/riverui/",
			"//evil.example/riverui/":     b.baseURL + "/riverui/",
		} {
			req, err := http.NewRequest(http.MethodGet, b.baseURL+"/riverui/login?next="+url.QueryEscape(next), nil)
			require.NoError(t, err)
			req.SetBasicAuth("ops", admin)
			resp, err := noRedirect.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusSeeOther, resp.StatusCode)
			require.Equal(t, want, resp.Header.Get("Location"), "next=%s", next)
		}
	})

	t.Run("Browser", func(t *testing.T) {
		chromium := testtool.Bin(t, "CHROMIUM_BIN", "chromium")
		browse := func(url string, extra ...string) string {
			t.Helper()
			ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
			defer cancel()
			args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
				"--disable-background-networking", "--disable-dev-shm-usage", "--virtual-time-budget=15000",
				"--user-data-dir=" + t.TempDir(), "--enable-logging=stderr"}, extra...)
			cmd := exec.CommandContext(ctx, chromium, append(args, url)...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if t.Failed() || err != nil {
				t.Logf("chromium stderr: %s", stderr.String())
			}
			require.NoError(t, err, "chromium %v", args)
			return string(out)
		}
		// A login link: the browser answers the basic-auth challenge with the
		// link's credentials, then lands on the page without them.
		withKey := strings.Replace(b.baseURL, "http://", "http://ops:"+admin+"@", 1) + "/riverui/login?next=/riverui/jobs?state=scheduled"

		dom := browse(withKey, "--dump-dom")
		require.Contains(t, dom, "charge_period", "the UI lists the period's charge job")

		dir := filepath.Join(repoRoot(t), ".tmp", "artifacts")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		shot := filepath.Join(dir, "riverui-jobs.png")
		browse(withKey, "--screenshot="+shot, "--window-size=1280,800")
		info, err := os.Stat(shot)
		require.NoError(t, err)
		require.Positive(t, info.Size())
		t.Logf("screenshot: %s", shot)

		// Without a key the browser gets the 401 (and its login prompt, which
		// headless Chromium leaves unanswered): nothing of the UI.
		denied := browse(b.baseURL+"/riverui/jobs", "--dump-dom")
		require.NotContains(t, denied, "charge_period")
		require.NotContains(t, denied, "config__json", "the UI's page was not served")
	})

	// What a page on another site can make a browser logged in to the UI
	// send is refused; the UI's own requests, and scripts', are not.
	t.Run("CrossSiteRequest", func(t *testing.T) {
		var jobID int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM river.river_job WHERE kind = 'charge_period'`).Scan(&jobID))
		jobState := func() string {
			t.Helper()
			var state string
			require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM river.river_job WHERE id = $1`, jobID).Scan(&state))
			return state
		}
		require.Equal(t, "scheduled", jobState())
		ids := `{"ids":["` + strconv.FormatInt(jobID, 10) + `"]}`

		// Exactly what <form method="post" enctype="text/plain"
		// action="…/riverui/api/jobs/cancel"> on https://evil.example sends.
		status, body := sendBasic(t, http.MethodPost, b.baseURL+"/riverui/api/jobs/cancel", admin, ids,
			map[string]string{"Origin": "https://evil.example", "Content-Type": "text/plain"})
		require.Equal(t, http.StatusForbidden, status, "body: %s", body)
		require.Contains(t, body, `"code":"cross_site_refused"`)
		require.Contains(t, body, `Origin \"https://evil.example\" is not this site`)
		require.Equal(t, "scheduled", jobState(), "the charge job is not cancelled")

		for name, header := range map[string]map[string]string{
			"another port of this host": {"Origin": "http://127.0.0.1:1", "Content-Type": "application/json"},
			"an opaque origin":          {"Origin": "null", "Content-Type": "application/json"},
			"a browser's cross-site":    {"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"},
			"a browser's same-site":     {"Sec-Fetch-Site": "same-site", "Origin": b.baseURL, "Content-Type": "application/json"},
			"a form without Origin":     {"Content-Type": "application/x-www-form-urlencoded"},
			"no content type":           {},
		} {
			status, body := sendBasic(t, http.MethodPost, b.baseURL+"/riverui/api/jobs/cancel", admin, ids, header)
			require.Equal(t, http.StatusForbidden, status, "%s: %s", name, body)
			require.Contains(t, body, `"code":"cross_site_refused"`, name)
		}
		require.Equal(t, "scheduled", jobState())

		// The same request from this site, as JSON, cancels the job.
		status, body = sendBasic(t, http.MethodPost, b.baseURL+"/riverui/api/jobs/cancel", admin, ids,
			map[string]string{"Origin": b.baseURL, "Content-Type": "application/json"})
		require.Equal(t, http.StatusOK, status, "body: %s", body)
		require.Equal(t, "cancelled", jobState())
		// The UI's own fetch: same-origin, its JSON body sent as text/plain.
		status, body = sendBasic(t, http.MethodPost, b.baseURL+"/riverui/api/jobs/retry", admin, ids,
			map[string]string{"Origin": b.baseURL, "Sec-Fetch-Site": "same-origin", "Content-Type": "text/plain;charset=UTF-8"})
		require.Equal(t, http.StatusOK, status, "body: %s", body)
		require.Equal(t, "available", jobState())
		// A script: no Origin, JSON.
		status, body = sendBasic(t, http.MethodPost, b.baseURL+"/riverui/api/jobs/cancel", admin, ids,
			map[string]string{"Content-Type": "application/json"})
		require.Equal(t, http.StatusOK, status, "body: %s", body)
		require.Equal(t, "cancelled", jobState())
	})

	// The kill switch's state is River's charge queue's, whoever paused or
	// resumed it; the operator log's record of who and why is shown only
	// when it agrees, and a disagreement is said.
	t.Run("KillSwitchFollowsTheQueue", func(t *testing.T) {
		type charging struct {
			Paused      bool    `json:"paused"`
			By          *string `json:"by"`
			Reason      *string `json:"reason"`
			Discrepancy *string `json:"discrepancy"`
		}
		state := func() (charging, float64) {
			t.Helper()
			status, _, body := b.call(t, admin, http.MethodGet, "/v1/admin/charging", "")
			require.Equal(t, http.StatusOK, status, "body: %s", body)
			var st charging
			require.NoError(t, json.Unmarshal(body, &st))
			status, text := scrape(t, b.baseURL+"/metrics", metricsToken)
			require.Equal(t, http.StatusOK, status)
			parser := expfmt.NewTextParser(model.UTF8Validation)
			families, err := parser.TextToMetricFamilies(strings.NewReader(text))
			require.NoError(t, err)
			return st, sample(t, families, "tally_charging_paused", nil)
		}
		setQueue := func(sql string) {
			t.Helper()
			tag, err := pool.Exec(ctx, sql)
			require.NoError(t, err)
			require.Equal(t, int64(1), tag.RowsAffected())
		}

		status, _, body := b.call(t, admin, http.MethodPost, "/v1/admin/charging/pause", `{"reason":"incident 42"}`)
		require.Equal(t, http.StatusOK, status, "body: %s", body)
		st, gauge := state()
		require.True(t, st.Paused)
		require.Equal(t, 1.0, gauge)
		require.NotNil(t, st.By)
		require.Nil(t, st.Discrepancy)

		// Resumed behind Tally's back (SQL, a River client): not paused, and
		// the operator log's pause is not shown as the state.
		setQueue(`UPDATE river.river_queue SET paused_at = NULL, updated_at = now() WHERE name = 'charges'`)
		st, gauge = state()
		require.False(t, st.Paused)
		require.Equal(t, 0.0, gauge)
		require.Nil(t, st.By)
		require.Nil(t, st.Reason)
		require.NotNil(t, st.Discrepancy)
		require.Contains(t, *st.Discrepancy, "resumed outside Tally")
		require.Contains(t, *st.Discrepancy, `"incident 42"`)

		// Paused again behind its back: paused, by no one on record.
		setQueue(`UPDATE river.river_queue SET paused_at = now(), updated_at = now() WHERE name = 'charges'`)
		st, gauge = state()
		require.True(t, st.Paused)
		require.Equal(t, 1.0, gauge)
		require.Nil(t, st.By)
		require.NotNil(t, st.Discrepancy)
		require.Regexp(t, `^River's charge queue was paused at \S+ outside Tally`, *st.Discrepancy)

		// An operator's resume records the state again.
		status, _, body = b.call(t, admin, http.MethodPost, "/v1/admin/charging/resume", `{"reason":"incident over"}`)
		require.Equal(t, http.StatusOK, status, "body: %s", body)
		st, gauge = state()
		require.False(t, st.Paused)
		require.Equal(t, 0.0, gauge)
		require.Equal(t, "incident over", *st.Reason)
		require.Nil(t, st.Discrepancy)
	})

	// River UI does not pause or resume the queues Tally runs: resuming the
	// charge queue there would lift the kill switch with no record.
	t.Run("TallyQueues", func(t *testing.T) {
		sameOrigin := map[string]string{"Origin": b.baseURL, "Content-Type": "application/json"}
		status, _, body := b.call(t, admin, http.MethodPost, "/v1/admin/charging/pause", `{"reason":"incident 43"}`)
		require.Equal(t, http.StatusOK, status, "body: %s", body)
		actions := func() int {
			t.Helper()
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM billing.operator_actions`).Scan(&n))
			return n
		}
		before := actions()

		status, text := sendBasic(t, http.MethodPut, b.baseURL+"/riverui/api/queues/charges/resume", admin, "", sameOrigin)
		require.Equal(t, http.StatusForbidden, status, "body: %s", text)
		require.Contains(t, text, `"code":"tally_queue"`)
		require.Contains(t, text, `billingctl charging resume --reason`)
		require.Contains(t, text, `POST /v1/admin/charging/resume`)
		status, _, body = b.call(t, admin, http.MethodGet, "/v1/admin/charging", "")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, string(body), `"paused":true`, "the kill switch holds")
		require.Contains(t, string(body), `"reason":"incident 43"`)
		require.Equal(t, before, actions())

		for _, queue := range append(slices.Clone(jobs.Queues), "*") {
			for _, verb := range []string{"pause", "resume"} {
				status, text := sendBasic(t, http.MethodPut, b.baseURL+"/riverui/api/queues/"+url.PathEscape(queue)+"/"+verb, admin, "", sameOrigin)
				require.Equal(t, http.StatusForbidden, status, "%s %s: %s", verb, queue, text)
				require.Contains(t, text, "billingctl charging "+verb, "%s %s", verb, queue)
			}
		}
		var pausedAt *time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT paused_at FROM river.river_queue WHERE name = 'charges'`).Scan(&pausedAt))
		require.NotNil(t, pausedAt, "still paused")

		// A queue Tally does not run is River UI's.
		_, err := pool.Exec(ctx, `INSERT INTO river.river_queue (name, created_at, metadata, updated_at) VALUES ('reports', now(), '{}', now())`)
		require.NoError(t, err)
		status, text = sendBasic(t, http.MethodPut, b.baseURL+"/riverui/api/queues/reports/pause", admin, "", sameOrigin)
		require.Equal(t, http.StatusOK, status, "body: %s", text)
		require.NoError(t, pool.QueryRow(ctx, `SELECT paused_at FROM river.river_queue WHERE name = 'reports'`).Scan(&pausedAt))
		require.NotNil(t, pausedAt)
		// And its pause too must come from the UI's own pages.
		status, text = sendBasic(t, http.MethodPut, b.baseURL+"/riverui/api/queues/reports/resume", admin, "",
			map[string]string{"Origin": "https://evil.example", "Content-Type": "text/plain"})
		require.Equal(t, http.StatusForbidden, status, "body: %s", text)
		require.Contains(t, text, `"code":"cross_site_refused"`)
	})
}

// repoRoot is the module root (the test runs in cmd/server).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return dir
}
