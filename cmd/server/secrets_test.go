package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// secretsWaitMax bounds each wait for the money path (a charge, a refund) in
// TestSecrets. It is a limit, not an assertion on duration.
const secretsWaitMax = 60 * time.Second

// capture is everything the program showed the outside world during a test:
// its stdout and stderr, every HTTP response (status, headers, body) and
// every error run returned.
type capture struct {
	mu    sync.Mutex
	items []capturedItem
}

type capturedItem struct {
	source string
	text   string
}

func (c *capture) add(source, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.items = append(c.items, capturedItem{source: source, text: text})
}

// addResponse records a response's status line, headers and body.
func (c *capture) addResponse(source string, status int, header http.Header, body []byte) {
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", status)
	_ = header.Write(&b)
	b.WriteString("\n")
	b.Write(body)
	c.add(source, b.String())
}

// responseRecorder is an http.RoundTripper that records every response it
// gets into capture: the simulator sends its webhooks through it, so what
// Tally answers Stripe is checked too.
type responseRecorder struct{ capture *capture }

func (r *responseRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	r.capture.addResponse("webhook delivery "+req.URL.Path, resp.StatusCode, resp.Header, body)
	return resp, nil
}

// secretSpec is one secret and the fragments of it that must not appear
// either: a partly masked secret is still a leak.
type secretSpec struct {
	name      string
	value     string
	fragments []string
}

// newSecret returns prefix + marker + 32 random hex digits. Its fragments are
// the marker, and every 12-digit window of the random part, so a secret shown
// with its head or its tail masked is caught as well as a whole one.
func newSecret(name, prefix, marker string) secretSpec {
	random := randomHexForTest(16)
	s := secretSpec{name: name, value: prefix + marker + random, fragments: []string{marker}}
	for i := 0; i+12 <= len(random); i++ {
		s.fragments = append(s.fragments, random[i:i+12])
	}
	return s
}

func randomHexForTest(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// requireNoSecret fails t for every captured item that shows a secret or a
// fragment of one, naming where it was seen.
func requireNoSecret(t *testing.T, c *capture, secrets []secretSpec) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, item := range c.items {
		for _, s := range secrets {
			for _, f := range append([]string{s.value}, s.fragments...) {
				if i := strings.Index(item.text, f); i >= 0 {
					lo, hi := max(0, i-200), min(len(item.text), i+len(f)+200)
					t.Errorf("%s leaked in %s (matched %q): …%s…", s.name, item.source, f, item.text[lo:hi])
					break
				}
			}
		}
	}
}

// startForSecrets starts run with env, registers its stop, and returns the
// bundle (run_test.go's) without waiting for readiness.
func startForSecrets(ctx context.Context, t *testing.T, env map[string]string) *testBundle {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	b := &testBundle{
		baseURL: "http://" + env["TALLY_HTTP_ADDR"],
		cancel:  cancel,
		runErr:  make(chan error, 1),
		stdout:  &syncBuffer{},
		stderr:  &syncBuffer{},
	}
	go func() {
		b.runErr <- run(ctx, []string{"server"}, func(k string) string { return env[k] }, b.stdout, b.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-b.runErr:
			if err != nil {
				t.Logf("run returned: %v", err)
			}
		case <-time.After(shutdownWaitMax):
			t.Errorf("run did not return after cancel")
		}
	})
	return b
}

// TestSecrets runs the server and its workers through a charge, a refund,
// refused requests and bad configurations, captures everything they print
// and answer, and requires that no Stripe key, webhook secret, database
// password or API key secret appears in any of it.
func TestSecrets(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	stripeKey := newSecret("STRIPE_API_KEY", "rk_test_", "SECRETKEY_")
	webhookSecret := newSecret("STRIPE_WEBHOOK_SECRET", "whsec_", "SECRETHOOK_")
	dbPassword := newSecret("database password", "", "SECRETDB_")
	badAPIKey := newSecret("unknown API key", "tly_0123456789_", "SECRETBADKEY_")
	secrets := []secretSpec{stripeKey, webhookSecret, dbPassword, badAPIKey}

	pool, databaseURL := testdb.New(t)
	// The test Postgres trusts local connections, so a password in the URL
	// is accepted and ignored: it still travels through the configuration.
	u, err := url.Parse(databaseURL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), dbPassword.value)
	databaseURLWithPassword := u.String()
	require.Contains(t, databaseURLWithPassword, dbPassword.value)

	c := &capture{}

	t.Run("BadConfigurations", func(t *testing.T) {
		runOnce := func(name string, env map[string]string) error {
			t.Helper()
			var stdout, stderr syncBuffer
			runCtx, cancel := context.WithTimeout(ctx, readyWaitMax)
			defer cancel()
			err := run(runCtx, []string{"server"}, func(k string) string { return env[k] }, &stdout, &stderr)
			c.add(name+": stdout", stdout.String())
			c.add(name+": stderr", stderr.String())
			if err != nil {
				c.add(name+": error", err.Error())
			}
			return err
		}

		err := runOnce("every variable wrong", map[string]string{
			"DATABASE_URL":    databaseURLWithPassword,
			"TALLY_HTTP_ADDR": freeAddr(t), "TALLY_METRICS_ADDR": "off",
			"STRIPE_API_KEY":        "sk_live_" + strings.TrimPrefix(stripeKey.value, "rk_test_"),
			"STRIPE_WEBHOOK_SECRET": strings.TrimPrefix(webhookSecret.value, "whsec_"),
			"TALLY_WORKERS":         "abc",
		})
		require.Error(t, err)
		for _, name := range []string{"STRIPE_API_KEY", "STRIPE_WEBHOOK_SECRET", "TALLY_WORKERS"} {
			require.ErrorContains(t, err, name+":")
		}

		err = runOnce("Stripe key of another kind", map[string]string{
			"DATABASE_URL":   databaseURLWithPassword,
			"STRIPE_API_KEY": "pk_live_" + strings.TrimPrefix(stripeKey.value, "rk_test_"),
		})
		require.ErrorContains(t, err, "STRIPE_API_KEY:")

		// Malformed database URLs carrying the password: the parser's error
		// must not repeat it.
		for i, dsn := range []string{
			"postgres://tally:" + dbPassword.value + "@127.0.0.1:99999/tally",
			"postgres://tally:" + dbPassword.value + "@127.0.0.1:5432/tally?sslmode=sometimes",
			"postgres://tally:" + dbPassword.value + "%zz@127.0.0.1:5432/tally",
			"postgres://tally:" + dbPassword.value + "@[::1/tally",
			"host=127.0.0.1 port=notaport user=tally password=" + dbPassword.value + " dbname=tally",
			"host=127.0.0.1 user=tally password='" + dbPassword.value + "' dbname=tally sslmode=sometimes",
		} {
			err := runOnce(fmt.Sprintf("malformed DATABASE_URL %d", i), map[string]string{
				"DATABASE_URL": dsn, "TALLY_ROLES": "api", "TALLY_HTTP_ADDR": freeAddr(t), "TALLY_METRICS_ADDR": "off",
			})
			require.Error(t, err, "DATABASE_URL %d", i)
		}

		// A database that does not answer: the API starts, /readyz says it
		// is the database (the detail is logged, not answered), and nothing
		// shows the password.
		addr := freeAddr(t)
		closed := freeAddr(t)
		b := startForSecrets(ctx, t, map[string]string{
			"DATABASE_URL":    "postgres://tally:" + dbPassword.value + "@" + closed + "/tally?sslmode=disable",
			"TALLY_HTTP_ADDR": addr, "TALLY_METRICS_ADDR": "off",
			"TALLY_ROLES":     "api",
			"TALLY_LOG_LEVEL": "debug",
		})
		b.waitStatus(t, "/readyz", http.StatusServiceUnavailable)
		resp, err := http.Get(b.baseURL + "/readyz")
		require.NoError(t, err)
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		c.addResponse("/readyz, database down", resp.StatusCode, resp.Header, out)
		require.JSONEq(t, `{"status":"unavailable","reason":"database"}`, string(out))
		b.stop(t)
		c.add("database down: stdout", b.stdout.String())
		c.add("database down: stderr", b.stderr.String())
		require.Contains(t, b.stdout.String(), `"msg":"not ready"`)
		require.Contains(t, b.stdout.String(), "postgres unreachable")
	})

	t.Run("ChargeRefundAndRefusedRequests", func(t *testing.T) {
		addr := freeAddr(t)
		sim := stripesim.New(stripesim.Config{
			WebhookURL:        "http://" + addr + "/v1/stripe/webhooks",
			WebhookSecret:     webhookSecret.value,
			WebhookHTTPClient: &http.Client{Timeout: 10 * time.Second, Transport: &responseRecorder{capture: c}},
		})
		t.Cleanup(sim.Close)
		simSrv := httptest.NewServer(sim)
		t.Cleanup(simSrv.Close)

		b := startForSecrets(ctx, t, map[string]string{
			"DATABASE_URL":    databaseURLWithPassword,
			"TALLY_HTTP_ADDR": addr, "TALLY_METRICS_ADDR": "off",
			"TALLY_ROLES":           "api,worker",
			"TALLY_PERIOD":          "day",
			"TALLY_WORKERS":         "4",
			"TALLY_LOG_LEVEL":       "debug",
			"STRIPE_API_KEY":        stripeKey.value,
			"STRIPE_API_BASE":       simSrv.URL,
			"STRIPE_WEBHOOK_SECRET": webhookSecret.value,
			"STRIPE_TIMEOUT":        "1s",
			"TALLY_RETRY_MAX_DELAY": "1s",
		})
		b.waitStatus(t, "/readyz", http.StatusOK)

		l, err := ledger.New(pool, ledger.Config{})
		require.NoError(t, err)
		apiKey, _, err := l.APIKeyCreate(ctx, "secrets-test", ledger.Scopes)
		require.NoError(t, err)
		_, apiKeySecret, _ := strings.Cut(strings.TrimPrefix(apiKey, "tly_"), "_")
		secrets = append(secrets, secretSpec{name: "API key secret", value: apiKey, fragments: []string{apiKeySecret}})

		call := func(secret, method, path, body string) (int, []byte) {
			t.Helper()
			status, header, out := b.call(t, secret, method, path, body)
			c.addResponse(method+" "+path, status, header, out)
			return status, out
		}

		// Three customers: acme is charged at once; globex's first call
		// outlives STRIPE_TIMEOUT (an error, then a retry with the same key,
		// which gets the result Stripe stored); initech's card is declined.
		require.NoError(t, sim.FaultAdd(stripesim.Fault{Customer: "cus_globex", Kind: stripesim.FaultKindLatency, Latency: 1500 * time.Millisecond, Count: 1}))
		require.NoError(t, sim.FaultAdd(stripesim.Fault{Customer: "cus_initech", Kind: stripesim.FaultKindDecline}))
		var status int
		var body []byte
		for _, customer := range []string{"acme", "globex", "initech"} {
			status, body = call(apiKey, http.MethodPut, "/v1/customers/"+customer,
				`{"stripe_customer_id":"cus_`+customer+`","currency":"usd"}`)
			require.Equal(t, http.StatusCreated, status, "body: %s", body)
			var period string
			for i, amount := range []int{1250, 750} {
				status, body = call(apiKey, http.MethodPost, "/v1/usage-events",
					fmt.Sprintf(`{"customer_id":%q,"event_id":"e%d","amount_cents":%d,"metric":"api_calls"}`, customer, i, amount))
				require.Equal(t, http.StatusCreated, status, "body: %s", body)
				var ev struct {
					Period string `json:"period"`
				}
				require.NoError(t, json.Unmarshal(body, &ev))
				period = ev.Period
			}
			status, body = call(apiKey, http.MethodPost, "/v1/customers/"+customer+"/periods/"+period+"/close", "")
			require.Equal(t, http.StatusOK, status, "body: %s", body)
		}

		type charge struct {
			ID             int64   `json:"id"`
			Status         string  `json:"status"`
			StripeChargeID *string `json:"stripe_charge_id"`
		}
		waitCharge := func(customer string, want ledger.ChargeStatus) charge {
			t.Helper()
			deadline := time.Now().Add(secretsWaitMax)
			for {
				status, body := call(apiKey, http.MethodGet, "/v1/charges?customer_id="+customer, "")
				require.Equal(t, http.StatusOK, status, "body: %s", body)
				var list struct {
					Data []charge `json:"data"`
				}
				require.NoError(t, json.Unmarshal(body, &list))
				if len(list.Data) == 1 && list.Data[0].Status == string(want) {
					return list.Data[0]
				}
				require.True(t, time.Now().Before(deadline), "the charge of %s never became %s; last: %s\nstdout: %s", customer, want, body, b.stdout)
				time.Sleep(100 * time.Millisecond)
			}
		}
		ch := waitCharge("acme", ledger.ChargeSucceeded)
		require.NotNil(t, ch.StripeChargeID)
		waitCharge("globex", ledger.ChargeSucceeded)
		waitCharge("initech", ledger.ChargePastDue) // declined: retried on the default dunning schedule

		// A refund made on Stripe's side: refund.created and charge.refunded
		// come back as signed webhooks and are recorded.
		_, err = sim.ChargeRefund(*ch.StripeChargeID, 500)
		require.NoError(t, err)
		deadline := time.Now().Add(secretsWaitMax)
		for {
			var n int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM billing.refunds WHERE charge_id = $1 AND amount_cents = 500`, ch.ID).Scan(&n))
			if n == 1 {
				break
			}
			require.True(t, time.Now().Before(deadline), "the refund was never recorded\nstdout: %s", b.stdout)
			time.Sleep(100 * time.Millisecond)
		}

		// Webhooks that do not verify: signed with another secret, signed
		// with a signature that names the real secret, and unsigned.
		payload := []byte(fmt.Sprintf(`{"id":"evt_forged","object":"event","type":"payment_intent.succeeded","created":%d,"api_version":%q,"data":{"object":{"id":"pi_forged","object":"payment_intent"}}}`,
			time.Now().Unix(), stripesim.APIVersion))
		forged := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: "whsec_not_the_secret"})
		for name, signature := range map[string]string{
			"wrong secret":     forged.Header,
			"secret in header": "t=1,v1=" + webhookSecret.value,
			"unsigned":         "",
		} {
			req, err := http.NewRequest(http.MethodPost, b.baseURL+"/v1/stripe/webhooks", bytes.NewReader(payload))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			if signature != "" {
				req.Header.Set("Stripe-Signature", signature)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			out, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			c.addResponse("webhook, "+name, resp.StatusCode, resp.Header, out)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", name, out)
		}

		// Requests with keys that are not Tally API keys, the Stripe key and
		// the webhook secret among them.
		for _, key := range []string{badAPIKey.value, stripeKey.value, webhookSecret.value} {
			status, body = call(key, http.MethodGet, "/v1/customers/acme", "")
			require.Equal(t, http.StatusUnauthorized, status, "body: %s", body)
		}

		b.stop(t)
		c.add("server stdout", b.stdout.String())
		c.add("server stderr", b.stderr.String())

		logs := b.stdout.String()
		lines := strings.Count(logs, "\n")
		t.Logf("server: %d log lines (%d bytes) on stdout, %d bytes on stderr", lines, len(logs), len(b.stderr.String()))
		require.Greater(t, lines, 50, "too few log lines for the test to mean anything")
		for _, want := range []string{
			`"level":"DEBUG"`,              // debug logs are captured
			`"component":"stripe-go"`,      // stripe-go's own logs too
			`"msg":"charge attempted"`,     // the charges
			`"status":"succeeded"`,         // acme's and globex's
			`"error_code":"card_declined"`, // initech's
			`"msg":"charge outcome unknown; retrying with the same key"`, // globex's timeout
			`context deadline exceeded`,                                  // and its error
			`"msg":"stripe webhook refused"`,                             // the bad signatures
			`"path":"/v1/stripe/webhooks","status":200`,                  // the refund's events
			`"status":401`, // the bad API keys
		} {
			require.True(t, strings.Contains(logs, want), "the logs lack %s", want)
		}
	})

	c.mu.Lock()
	n := len(c.items)
	c.mu.Unlock()
	t.Logf("looked for %d secrets in %d captured outputs", len(secrets), n)
	requireNoSecret(t, c, secrets)
}
