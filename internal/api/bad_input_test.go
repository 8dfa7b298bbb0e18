package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76/webhook"
)

// Nasty inputs that once made a route answer 500, or could.
var (
	// badSegments go in a path segment, escaped.
	badSegments = []string{
		"%00", "%ff", "%FF%FE", "a%0Ab", "%7F", "%C0%80", "%ED%A0%80", "%2F", "..", "%20", "%E2%80%AE",
		"-1", "0", "99999999999999999999", "1e3", "0x10", "2026-11%00", strings.Repeat("x", 256), strings.Repeat("%C3%A9", 200),
	}

	// badQueryValues go in a query parameter, escaped.
	badQueryValues = append([]string{"", "%", "%zz", "-5", "1.5", "%2B1"}, badSegments...)

	// badJSONValues replace one field of a valid body.
	badJSONValues = []string{
		`"\u0000"`, `"a\u0000b"`, `"\ud800"`, `"\udfff\ud800"`, `"\u0007"`, "\"\xff\xfe\"", `""`, `" "`,
		`"` + strings.Repeat("x", 300) + `"`, `"` + strings.Repeat("é", 1001) + `"`,
		`1e1000000`, `-1e1000000`, `1e-1000000`, `1e131071`, `0e-20000`, `99999999999999999999`,
		`-9223372036854775809`, `9223372036854775807`, `1.5`, `-0`, `null`, `true`, `[]`, `{}`,
		`{"x":1e1000000}`, `{"x":"\u0000"}`, `[` + strings.Repeat(`[`, 5000) + strings.Repeat(`]`, 5000) + `]`,
		`"2026-11-14T10:30:00Z"`, `"9999-12-31T23:59:59Z"`, `"0001-01-01T00:00:00Z"`, `"2026-11-14T10:30:00+99:00"`,
	}

	// badBodies replace a whole body.
	badBodies = []string{"", "null", "[]", "{", "\xff", `{"a":1}`, `{}{}`, `"x"`, `{"events":null}`, strings.Repeat(`{"a":`, 3000)}
)

// bodyRoute is a route with a JSON body: a valid body by field.
type bodyRoute struct {
	method, path string
	fields       map[string]string
}

// body returns the route's body with field set to value.
func (r bodyRoute) body(field, value string) string {
	parts := make([]string, 0, len(r.fields))
	for k, v := range r.fields {
		if k == field {
			v = value
		}
		parts = append(parts, fmt.Sprintf("%q:%s", k, v))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestBadInput hits every route with the inputs above and requires that
// none answers 5xx (nor a body larger than what it was sent plus 64 KiB).
func TestBadInput(t *testing.T) {
	t.Parallel()
	_, b := setup(t, setupOpts{})
	b.Plan(t, "std", planPerUnit) // acme's quantity events of api_calls are priced
	require.Equal(t, http.StatusOK, b.do(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd","plan_id":"std"}`).Code)
	require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("e1", 100)).Code)

	const secret = "whsec_badinput"
	webhooks := newServer(t, b.Logger, b.Ledger, func(context.Context) error { return nil }, secret)

	requests := 0
	check := func(t *testing.T, h http.Handler, req *http.Request, sent int) {
		t.Helper()
		requests++
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Less(t, rec.Code, 500, "%s %s: %d %.500s", req.Method, req.URL, rec.Code, rec.Body)
		require.Less(t, rec.Body.Len(), sent+64<<10, "%s %s", req.Method, req.URL)
	}
	serve := func(t *testing.T, method, target, body string) {
		t.Helper()
		req := httptest.NewRequest(method, "/", strings.NewReader(body))
		// httptest.NewRequest refuses some raw targets; set them as sent.
		req.URL.RawQuery = ""
		path, query, _ := strings.Cut(target, "?")
		req.URL.RawPath = path
		req.URL.Path = unescape(path)
		req.URL.RawQuery = query
		req.RequestURI = target
		req.Header.Set("Authorization", "Bearer "+b.secret)
		req.Header.Set("Content-Type", "application/json")
		check(t, b.handler, req, len(target)+len(body))
	}

	t.Run("BodyFields", func(t *testing.T) {
		event := map[string]string{
			"customer_id": `"acme"`, "event_id": `"e2"`, "amount_cents": `1`, "currency": `"usd"`,
			"metric": `"m"`, "properties": `{"a":1}`, "occurred_at": `"2026-11-14T10:00:00Z"`,
		}
		quantityEvent := map[string]string{
			"customer_id": `"acme"`, "event_id": `"e3"`, "currency": `"usd"`, "quantity": `"2.5"`,
			"metric": `"api_calls"`, "properties": `{"a":1}`, "occurred_at": `"2026-11-14T10:00:00Z"`,
		}
		routes := []bodyRoute{
			{http.MethodPut, "/v1/customers/beta", map[string]string{
				"stripe_customer_id": `"cus_1"`, "stripe_payment_method_id": `"pm_1"`, "currency": `"usd"`, "max_charge_cents": `100`,
				"usage_alert_thresholds_cents": `[100]`, "plan_id": `null`}},
			{http.MethodPost, "/v1/charges/1/approve", map[string]string{"reason": `"r"`}},
			{http.MethodPost, "/v1/charges/1/cancel", map[string]string{"reason": `"r"`}},
			{http.MethodPost, "/v1/charges/1/retry", map[string]string{"reason": `"r"`}},
			{http.MethodPost, "/v1/charges/1/resolve", map[string]string{"keep_payment_intent": `"pi_1"`, "reason": `"r"`}},
			{http.MethodPost, "/v1/admin/charging/pause", map[string]string{"reason": `"r"`}},
			{http.MethodPost, "/v1/admin/charging/resume", map[string]string{"reason": `"r"`}},
			{http.MethodPost, "/v1/webhook-endpoints", map[string]string{
				"url": `"https://example.com/h"`, "events": `["*"]`, "description": `"d"`}},
			{http.MethodPost, "/v1/webhook-endpoints/1/rotate-secret", map[string]string{"grace_period_seconds": `60`}},
			{http.MethodPost, "/v1/usage-events", event},
			{http.MethodPost, "/v1/usage-events", quantityEvent},
			{http.MethodPut, "/v1/plans/std", map[string]string{
				"currency": `"usd"`, "prices": `{"m":{"model":"graduated","tiers":[{"up_to":"10","unit_amount":"1"},{"up_to":null,"unit_amount":"0.5"}]}}`}},
		}
		for _, r := range routes {
			for field := range r.fields {
				for _, v := range badJSONValues {
					if _, ok := r.fields["event_id"]; ok && field != "event_id" {
						// A fresh event each time, or all but the first are
						// idempotency conflicts, found before any insert.
						r.fields["event_id"] = fmt.Sprintf(`"b%d"`, requests)
					}
					body := r.body(field, v)
					serve(t, r.method, r.path, body)
					if r.path == "/v1/usage-events" {
						serve(t, http.MethodPost, "/v1/usage-events/batch", batchJSON(eventJSON("ok", 1), body))
					}
				}
			}
			for _, body := range badBodies {
				serve(t, r.method, r.path, body)
			}
		}
		for _, v := range badJSONValues {
			serve(t, http.MethodPost, "/v1/usage-events/batch", `{"events":`+v+`}`)
			serve(t, http.MethodPost, "/v1/usage-events/batch", `{"events":[`+v+`]}`)
		}
		for _, body := range badBodies {
			serve(t, http.MethodPost, "/v1/usage-events/batch", body)
		}
	})

	t.Run("PathSegments", func(t *testing.T) {
		for _, seg := range badSegments {
			serve(t, http.MethodGet, "/v1/customers/"+seg, "")
			serve(t, http.MethodPut, "/v1/customers/"+seg, `{"stripe_customer_id":"cus_1","currency":"usd"}`)
			serve(t, http.MethodGet, "/v1/customers/"+seg+"/periods", "")
			serve(t, http.MethodGet, "/v1/customers/"+seg+"/periods/2026-11", "")
			serve(t, http.MethodGet, "/v1/customers/acme/periods/"+seg, "")
			serve(t, http.MethodPost, "/v1/customers/"+seg+"/periods/2026-11/close", "")
			serve(t, http.MethodPost, "/v1/customers/acme/periods/"+seg+"/close", "")
			serve(t, http.MethodGet, "/v1/charges/"+seg, "")
			serve(t, http.MethodPost, "/v1/charges/"+seg+"/approve", `{"reason":"r"}`)
			serve(t, http.MethodPost, "/v1/charges/"+seg+"/cancel", `{"reason":"r"}`)
			serve(t, http.MethodPost, "/v1/charges/"+seg+"/retry", "")
			serve(t, http.MethodPost, "/v1/charges/"+seg+"/resolve", `{"keep_payment_intent":"pi_1","reason":"r"}`)
			serve(t, http.MethodPut, "/v1/plans/"+seg, `{"currency":"usd","prices":{}}`)
			serve(t, http.MethodGet, "/v1/plans/"+seg, "")
		}
	})

	t.Run("QueryParameters", func(t *testing.T) {
		for _, v := range badQueryValues {
			for _, name := range []string{"status", "customer_id", "limit", "starting_after"} {
				serve(t, http.MethodGet, "/v1/charges?"+name+"="+v, "")
				serve(t, http.MethodGet, "/v1/customers/acme/periods?"+name+"="+v, "")
				serve(t, http.MethodGet, "/v1/plans?"+name+"="+v, "")
			}
			serve(t, http.MethodGet, "/v1/charges?customer_id="+v+"&customer_id=acme&status="+v, "")
			serve(t, http.MethodGet, "/v1/customers/acme?x="+v, "")
			serve(t, http.MethodGet, "/healthz?"+v, "")
		}
	})

	t.Run("SignedWebhooks", func(t *testing.T) {
		for _, payload := range []string{
			`{"id":"\u0000","type":"payment_intent.succeeded","created":1}`,
			`{"id":"","type":"payment_intent.succeeded","created":1}`,
			`{"id":"evt_` + strings.Repeat("x", 300) + `","type":"x","created":1}`,
			"{\"id\":\"evt_\xff\",\"type\":\"x\",\"created\":1}",
			`{"id":"evt_a\nb","type":"x","created":1}`,
			`{"id":"evt_1","type":"","created":1}`,
			`{"id":"evt_1","type":"x\u0000","created":1}`,
			`{"id":"evt_2","type":"x","created":1e1000000}`,
			`{"id":"evt_3","type":"x","created":-9223372036854775808}`,
			`{"id":"evt_4","type":"x","created":9223372036854775807}`,
			`{"id":"evt_5","type":"x","created":1,"data":{"object":{"note":"\u0000"}}}`,
			`{"id":"evt_6","type":"x","created":1,"data":{"object":{"amount":1e1000000}}}`,
			`{"id":"evt_7","type":"x","created":1,"data":{"object":{"amount":0e-20000}}}`,
			`{"id":"evt_8","type":"x","created":1,"data":{"object":{"\u0000":1}}}`,
			`{"id":"evt_9","type":"x","created":1,"data":[]}`,
			`{"id":"evt_10","type":"x","created":1,"data":{"object":[1,2]}}`,
			`{"id":"evt_11","type":"x","created":1,"data":{"object":{"deep":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}}}`,
			`[]`, `null`, `"x"`, `{}`,
		} {
			signed := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: []byte(payload), Secret: secret, Timestamp: time.Now()})
			req := httptest.NewRequest(http.MethodPost, "/v1/stripe/webhooks", strings.NewReader(payload))
			req.Header.Set("Stripe-Signature", signed.Header)
			req.Header.Set("Content-Type", "application/json")
			check(t, webhooks, req, len(payload))
		}
		for _, header := range []string{"", "t=", "t=abc,v1=00", "t=-99999999999999999999,v1=00", "t=1,v1=zz", "v1=" + strings.Repeat("0", 10000), "\x00"} {
			req := httptest.NewRequest(http.MethodPost, "/v1/stripe/webhooks", strings.NewReader(`{}`))
			req.Header.Set("Stripe-Signature", header)
			check(t, webhooks, req, 2)
		}
	})

	t.Logf("%d requests, none answered 5xx", requests)
}

// unescape is url.PathUnescape that keeps what it cannot unescape.
func unescape(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			c, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				panic(err) // both are hex digits
			}
			sb.WriteByte(byte(c))
			i += 2
			continue
		}
		sb.WriteByte(s[i])
	}
	return sb.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// TestBadInputProblemsBounded sends bodies with a problem per key (an event
// of 1 MiB with tens of thousands of unknown fields, a batch of 8 MiB of
// them, keys and property paths of hundreds of KiB) and requires answers of
// a few KiB that list some problems and count the others in omitted: a
// problem per key once answered an event of 1 MiB with 7.7 MB and a batch
// with 73 MB.
func TestBadInputProblemsBounded(t *testing.T) {
	t.Parallel()
	_, b := setup(t, setupOpts{})

	// unknownKeys returns n unknown fields, such as "k1_000001":0.
	unknownKeys := func(tag string, n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(`"k%s_%06d":0`, tag, i)
		}
		return strings.Join(parts, ",")
	}
	const answerMax = 16 << 10

	t.Run("Batch", func(t *testing.T) {
		const events, keys = 1000, 480 // 8 MiB less a little
		items := make([]string, events)
		for i := range items {
			items[i] = fmt.Sprintf(`{"customer_id":"acme","event_id":"e%d","amount_cents":1,%s}`, i, unknownKeys(strconv.Itoa(i), keys))
		}
		body := batchJSON(items...)
		require.Less(t, len(body), 8<<20)
		require.Greater(t, len(body), 7<<20)

		rec := b.requireBatchRejected(t, body)
		require.Less(t, rec.Body.Len(), answerMax)
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "batch_rejected")
		require.NotEmpty(t, p.Items)
		require.Equal(t, events, len(p.Items)+p.Omitted, "items listed and omitted")
		for i, it := range p.Items {
			require.Equal(t, i, it.Index, "the first failing events, in order")
			require.NotEmpty(t, it.Errors)
			require.Equal(t, keys, len(it.Errors)+it.Omitted, "fields listed and omitted")
		}
		require.Contains(t, p.Detail, "1000 events were rejected")
	})

	t.Run("Event", func(t *testing.T) {
		var sb strings.Builder
		sb.WriteString(`{"customer_id":"acme","event_id":"e1","amount_cents":1`)
		keys := 0
		for sb.Len() < 1<<20-64 {
			fmt.Fprintf(&sb, `,"k%06d":0`, keys)
			keys++
		}
		sb.WriteString("}")
		require.Greater(t, keys, 80_000)

		rec := b.requireEventRejected(t, sb.String())
		require.Less(t, rec.Body.Len(), answerMax)
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "validation_error")
		require.NotEmpty(t, p.Errors)
		require.Equal(t, keys, len(p.Errors)+p.Omitted, "fields listed and omitted")
		require.Contains(t, p.Errors, "k000000")
	})

	t.Run("LongNames", func(t *testing.T) {
		long := strings.Repeat("x", 256<<10)
		rec := b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1,"`+long+`":0}`)
		require.Less(t, rec.Body.Len(), 2<<10)
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "validation_error")
		require.Len(t, p.Errors, 1)
		for name := range p.Errors {
			require.True(t, strings.HasPrefix(name, "xxxx") && strings.HasSuffix(name, "…"), "name %.100q", name)
		}

		// A number out of bounds deep in properties: the ledger names its
		// path, 5,000 keys of 32 bytes long.
		key := strings.Repeat("p", 32)
		props := strings.Repeat(`{"`+key+`":`, 5_000) + "1e1000" + strings.Repeat("}", 5_000)
		rec = b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1,"properties":`+props+`}`)
		require.Less(t, rec.Body.Len(), 2<<10)
		p = requireProblem(t, rec, http.StatusUnprocessableEntity, "validation_error")
		require.Len(t, p.Errors, 1)
		for name := range p.Errors {
			require.True(t, strings.HasPrefix(name, "properties."+key+"."+key), "name %.100q", name)
		}
	})
}
