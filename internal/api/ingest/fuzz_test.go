package ingest

// Fuzz targets for what the API decodes from strangers: usage events (one,
// and batches) and Stripe webhooks. Each serves the real handler with the
// ledger call stubbed by a function that applies the ledger's database-free
// rules (ledger.UsageEventProperties) and checks what the handler passes on,
// so no database is needed. They live here, not in package api, so that the
// test binary `go test -fuzz` instruments imports neither api nor its test
// dependencies (the OpenAPI validator, River, goose, testdb). Seeds (with
// the inputs that once answered 500 or 65 MB) are in
// testdata/fuzz/<target>/; `make fuzz` runs each for FUZZTIME.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/apd/v3"
	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
)

var fuzzLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// fuzzRecord stands in for the ledger's recording of one event: the
// properties rules that need no database, then an event as the ledger would
// store it.
func fuzzRecord(t *testing.T, p ledger.UsageEventParams) (*ledger.UsageEventResult, error) {
	if p.Properties != nil && !json.Valid(p.Properties) {
		t.Fatalf("the handler passed properties that are not JSON: %q", p.Properties)
	}
	props, err := ledger.UsageEventProperties(p.Properties)
	if err != nil {
		var ve *ledger.ValidationError
		if !errors.As(err, &ve) || len(ve.Fields) != 1 {
			t.Fatalf("properties %q: want one field error, got %v", p.Properties, err)
		}
		for field := range ve.Fields {
			if !strings.HasPrefix(field, "properties") {
				t.Fatalf("properties %q: error names %q", p.Properties, field)
			}
		}
		return nil, err
	}
	if len(props) > ledger.UsageEventPropertiesMaxBytes {
		t.Fatalf("properties of %d bytes accepted", len(props))
	}
	// encoding/json refuses a number beyond a float64 as a float64.
	var decoded map[string]any
	if err := json.Unmarshal(props, &decoded); err != nil {
		t.Fatalf("properties accepted that a float64 cannot hold: %.200q: %v", props, err)
	}
	again, err := ledger.UsageEventProperties(props)
	if err != nil || !bytes.Equal(again, props) {
		t.Fatalf("canonical properties are not stable: %q -> %q (%v)", props, again, err)
	}
	occurredAt := time.Date(2026, 11, 14, 10, 30, 0, 0, time.UTC)
	if p.OccurredAt != nil {
		occurredAt = *p.OccurredAt
	}
	var metric *string
	if p.Metric != "" {
		metric = &p.Metric
	}
	var quantity *apd.Decimal
	if p.Quantity != "" {
		q, err := pricing.ParseQuantity(p.Quantity)
		if err != nil {
			return nil, &ledger.ValidationError{Fields: map[string]string{"quantity": err.Error()}}
		}
		quantity = &q
	}
	return &ledger.UsageEventResult{Event: &ledger.UsageEvent{
		CustomerID: p.CustomerID, EventID: p.EventID, Period: "2026-11", AmountCents: p.AmountCents,
		Currency: "usd", Quantity: quantity, Metric: metric, Properties: props,
		OccurredAt: occurredAt, ReceivedAt: occurredAt,
	}}, nil
}

// fuzzServe posts body to h and checks what every answer must be: no 5xx,
// JSON, and no larger than what was sent can explain (invalid UTF-8 grows six
// times as \ufffd) plus the stored properties. It does not hold the answer
// to the OpenAPI document: package api's tests hold every answer of theirs
// to it, and here the validator would cost each run far more than the
// handler does (a fuzzer lives on runs per second), and the build of this
// package's test binary its dependencies (docs/benchmarks.md, "Figures
// behind the code's choices").
func fuzzServe(t *testing.T, h http.Handler, path string, body []byte, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code >= 500 {
		t.Fatalf("%s answered %d: %s", path, rec.Code, rec.Body)
	}
	if !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("%s answered %d with a body that is not JSON: %q", path, rec.Code, rec.Body)
	}
	if max := 6*len(body) + 2*ledger.UsageEventPropertiesMaxBytes + 4096; rec.Body.Len() > max {
		t.Fatalf("%s answered %d bytes to %d", path, rec.Body.Len(), len(body))
	}
	return rec
}

// FuzzUsageEventDecode posts body as a usage event, and then, when number is
// not empty, an event whose properties hold number (as a value, in an array
// and under a nested key), so the fuzzer mutates numbers directly too.
func FuzzUsageEventDecode(f *testing.F) {
	f.Add([]byte(`{"customer_id":"acme","event_id":"e1","amount_cents":1250,"properties":{"n":1.5}}`), "1.5e-3")
	f.Fuzz(func(t *testing.T, body []byte, number string) {
		bodies := [][]byte{body}
		if number != "" {
			bodies = append(bodies, []byte(`{"customer_id":"acme","event_id":"e1","amount_cents":1,"properties":{"x":`+
				number+`,"a":[`+number+`],"b":{"c d":`+number+`}}}`))
		}
		for _, body := range bodies {
			called := false
			h := UsageEventCreate(fuzzLogger, nil, func(_ context.Context, p ledger.UsageEventParams) (*ledger.UsageEventResult, error) {
				called = true
				return fuzzRecord(t, p)
			})
			rec := fuzzServe(t, h, "/v1/usage-events", body, nil)
			switch rec.Code {
			case http.StatusCreated:
				if !called {
					t.Fatalf("201 without recording")
				}
			case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
			default:
				t.Fatalf("unexpected status %d: %s", rec.Code, rec.Body)
			}
		}
	})
}

func FuzzUsageEventBatchDecode(f *testing.F) {
	f.Add([]byte(`{"events":[{"customer_id":"acme","event_id":"e1","amount_cents":1},{"customer_id":"acme","event_id":"e2"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var n int
		recordAll := func(params []ledger.UsageEventParams) ([]*ledger.UsageEventResult, error) {
			n = len(params)
			if n == 0 || n > ledger.UsageEventBatchMax {
				t.Fatalf("the handler passed %d events", n)
			}
			results := make([]*ledger.UsageEventResult, len(params))
			items := map[int]error{}
			for i, p := range params {
				res, err := fuzzRecord(t, p)
				if err != nil {
					items[i] = err
				}
				results[i] = res
			}
			if len(items) > 0 {
				return nil, &ledger.BatchError{Items: items}
			}
			return results, nil
		}
		h := UsageEventBatch(fuzzLogger, nil,
			func(_ context.Context, params []ledger.UsageEventParams) ([]*ledger.UsageEventResult, error) {
				return recordAll(params)
			},
			func(_ context.Context, params []ledger.UsageEventParams) error {
				_, err := recordAll(params)
				return err
			})
		rec := fuzzServe(t, h, "/v1/usage-events/batch", body, nil)
		switch rec.Code {
		case http.StatusCreated, http.StatusOK:
			var resp struct {
				Data []json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || len(resp.Data) != n {
				t.Fatalf("%d results for %d events (%v)", len(resp.Data), n, err)
			}
		case http.StatusUnprocessableEntity, http.StatusConflict:
			var p httpjson.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
				t.Fatal(err)
			}
			for _, it := range p.Items {
				if it.Index < 0 || it.Index >= ledger.UsageEventBatchMax {
					t.Fatalf("item index %d", it.Index)
				}
			}
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("unexpected status %d: %s", rec.Code, rec.Body)
		}
	})
}

// fuzzWebhookSecret signs the fuzzed webhooks.
const fuzzWebhookSecret = "whsec_fuzz"

// Ways FuzzStripeWebhook signs a payload.
const (
	fuzzSignValid  = iota // a valid signature, now
	fuzzSignStale         // a valid signature, 301 s old
	fuzzSignWrong         // signed with another secret
	fuzzSignHeader        // the fuzzed header as sent
)

func FuzzStripeWebhook(f *testing.F) {
	f.Add([]byte(`{"id":"evt_1","object":"event","type":"payment_intent.succeeded","created":1700000000,"data":{"object":{"id":"pi_1"}}}`),
		uint8(fuzzSignValid), "")
	f.Fuzz(func(t *testing.T, payload []byte, mode uint8, header string) {
		mode %= 4
		now := time.Now()
		switch mode {
		case fuzzSignValid:
			header = webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: fuzzWebhookSecret, Timestamp: now}).Header
		case fuzzSignStale:
			header = webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: fuzzWebhookSecret, Timestamp: now.Add(-301 * time.Second)}).Header
		case fuzzSignWrong:
			header = webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: payload, Secret: "whsec_other", Timestamp: now}).Header
		}
		called := false
		h := StripeWebhook(fuzzLogger, func(_ context.Context, p ledger.StripeEventParams) (bool, error) {
			called = true
			if mode != fuzzSignValid && mode != fuzzSignHeader {
				t.Fatalf("an event signed %d reached the ledger", mode)
			}
			// What Postgres would refuse: ids it cannot hold, times out of
			// range, payloads that are not UTF-8 JSON with numbers a float64
			// holds and no NUL.
			for _, id := range []string{p.ID, p.Type} {
				if id == "" || len(id) > 255 || !utf8.ValidString(id) || strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
					t.Fatalf("the handler passed id or type %q", id)
				}
			}
			if y := p.CreatedAt.Year(); y < 1970 || y > 9999 {
				t.Fatalf("the handler passed created %s", p.CreatedAt)
			}
			var v any
			if !utf8.Valid(p.Payload) || json.Unmarshal(p.Payload, &v) != nil {
				t.Fatalf("the handler passed a payload Postgres refuses: %q", p.Payload)
			}
			if strings.ContainsRune(fmtJSON(v), 0) {
				t.Fatalf("the handler passed a payload holding NUL: %q", p.Payload)
			}
			return len(p.ID)%2 == 0, nil
		}, fuzzWebhookSecret)
		rec := fuzzServe(t, h, "/v1/stripe/webhooks", payload, http.Header{"Stripe-Signature": {header}})
		if rec.Code == http.StatusOK && !called {
			t.Fatalf("200 without storing the event")
		}
		if rec.Code != http.StatusOK && called {
			t.Fatalf("stored, then answered %d", rec.Code)
		}
		if mode == fuzzSignStale || mode == fuzzSignWrong {
			if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "invalid_signature") {
				t.Fatalf("a bad signature answered %d: %s", rec.Code, rec.Body)
			}
		}
	})
}

// fmtJSON renders a decoded JSON value with every key and string as Go sees
// it, so a NUL shows as a NUL.
func fmtJSON(v any) string {
	var sb strings.Builder
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			sb.WriteString(v)
		case map[string]any:
			for k, e := range v {
				sb.WriteString(k)
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return sb.String()
}
