package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// usageEventBody is a usage event as the API answers it.
type usageEventBody struct {
	CustomerID  string          `json:"customer_id"`
	EventID     string          `json:"event_id"`
	Period      string          `json:"period"`
	AmountCents int64           `json:"amount_cents"`
	Currency    string          `json:"currency"`
	Quantity    *int64          `json:"quantity"`
	Metric      *string         `json:"metric"`
	Properties  json.RawMessage `json:"properties"`
	OccurredAt  time.Time       `json:"occurred_at"`
	ReceivedAt  time.Time       `json:"received_at"`
}

// postEvent posts body to /v1/usage-events.
func (b *testBundle) postEvent(body string) *httptest.ResponseRecorder {
	return b.do(http.MethodPost, "/v1/usage-events", body)
}

// requireEventRejected posts body, requires that nothing was written, and
// returns the response.
func (b *testBundle) requireEventRejected(t *testing.T, body string) *httptest.ResponseRecorder {
	t.Helper()
	return b.requireNothingWritten(t, b.newRequest(http.MethodPost, "/v1/usage-events", body))
}

func TestUsageEventCreate(t *testing.T) {
	t.Parallel()

	t.Run("AmountAbsurd", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1e30}`), "amount_cents")
	})

	t.Run("AmountAtMax", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.postEvent(eventJSON("e1", 1_000_000_000_000))
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
	})

	t.Run("AmountFractional", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1.5}`), "amount_cents")
	})

	t.Run("AmountMissing", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, body := range []string{
			`{"customer_id":"acme","event_id":"e1"}`,
			`{"customer_id":"acme","event_id":"e1","amount_cents":null}`,
		} {
			p := requireInvalid(t, b.requireEventRejected(t, body), "amount_cents")
			require.Len(t, p.Errors, 1, "errors: %v", p.Errors)
		}
	})

	t.Run("AmountNegative", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.requireEventRejected(t, eventJSON("e1", -100)), "amount_cents")
	})

	t.Run("AmountString", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		p := requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":"12"}`), "amount_cents")
		require.Contains(t, p.Errors["amount_cents"], "string")
	})

	t.Run("AmountTooLarge", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.requireEventRejected(t, eventJSON("e1", 1_000_000_000_001)), "amount_cents")
		requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":9223372036854775808}`), "amount_cents")
	})

	t.Run("AmountZero", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.requireEventRejected(t, eventJSON("e1", 0)), "amount_cents")
	})

	t.Run("BodyTooLarge", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		body := `{"customer_id":"acme","event_id":"e1","amount_cents":1,"metric":"` + strings.Repeat("m", 1<<20) + `"}`
		requireProblem(t, b.requireEventRejected(t, body), http.StatusRequestEntityTooLarge, "body_too_large")
	})

	t.Run("ConcurrentReplays", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		srv := httptest.NewServer(b.handler)
		t.Cleanup(srv.Close)

		const n = 20
		type answer struct {
			status   int
			replayed string
			body     []byte
			err      error
		}
		answers := make([]answer, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/usage-events", strings.NewReader(eventJSON("same", 250)))
				if err != nil {
					answers[i].err = err
					return
				}
				req.Header.Set("Authorization", "Bearer "+b.secret)
				req.Header.Set("Content-Type", "application/json")
				resp, err := srv.Client().Do(req)
				if err != nil {
					answers[i].err = err
					return
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				answers[i] = answer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed"), body: body, err: err}
			})
		}
		wg.Wait()

		created := 0
		for _, a := range answers {
			require.NoError(t, a.err)
			switch a.status {
			case http.StatusCreated:
				created++
				require.Empty(t, a.replayed)
			case http.StatusOK:
				require.Equal(t, "true", a.replayed)
			default:
				require.Failf(t, "unexpected status", "%d %s", a.status, a.body)
			}
			require.Equal(t, string(answers[0].body), string(a.body))
		}
		require.Equal(t, 1, created)
		require.Equal(t, rows{Customers: 1, Events: 1, Periods: 1, Jobs: 1}, b.rows(t))
	})

	t.Run("Creates", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.postEvent(eventJSON("e1", 1250))
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		require.Empty(t, rec.Header().Get("Idempotent-Replayed"))
		ev := decodeJSON[usageEventBody](t, rec)
		require.Equal(t, "acme", ev.CustomerID)
		require.Equal(t, "e1", ev.EventID)
		require.Equal(t, "2026-11", ev.Period)
		require.Equal(t, int64(1250), ev.AmountCents)
		require.Equal(t, "usd", ev.Currency)
		require.Nil(t, ev.Quantity)
		require.Equal(t, "api_calls", *ev.Metric)
		require.JSONEq(t, `{}`, string(ev.Properties))
		require.True(t, ev.OccurredAt.Equal(ledgertest.ClockStart), "occurred_at defaults to now: %s", ev.OccurredAt)
		require.True(t, ev.ReceivedAt.Equal(ledgertest.ClockStart))
		require.Equal(t, rows{Customers: 1, Events: 1, Periods: 1, Jobs: 1}, b.rows(t))
	})

	t.Run("CreatesWithEveryField", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		// Every field of a pre-priced event (a quantity event's are in
		// TestUsageEventQuantity).
		rec := b.postEvent(`{"customer_id":"acme","event_id":"e1","amount_cents":7,"currency":"USD",
			"metric":"tokens","properties":{"model":"x","n":1},"occurred_at":"2026-11-14T12:00:00+02:00"}`)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		ev := decodeJSON[usageEventBody](t, rec)
		require.Equal(t, "usd", ev.Currency)
		require.Equal(t, int64(7), ev.AmountCents)
		require.Nil(t, ev.Quantity)
		require.Equal(t, "tokens", *ev.Metric)
		require.JSONEq(t, `{"model":"x","n":1}`, string(ev.Properties))
		require.True(t, ev.OccurredAt.Equal(time.Date(2026, 11, 14, 10, 0, 0, 0, time.UTC)), "occurred_at: %s", ev.OccurredAt)
	})

	t.Run("CurrencyMismatch", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		p := requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1,"currency":"eur"}`), "currency")
		require.Contains(t, p.Errors["currency"], "usd")
	})

	t.Run("EventIDTooLong", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.requireEventRejected(t, eventJSON(strings.Repeat("e", 256), 1)), "event_id")

		// 255 bytes of multi-byte characters are still fine; 256 are not.
		rec := b.postEvent(eventJSON(strings.Repeat("é", 127)+"e", 1))
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		requireInvalid(t, b.requireEventRejected(t, eventJSON(strings.Repeat("é", 128), 1)), "event_id")
	})

	t.Run("EventIDWithControlCharacter", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, id := range []string{`e\u0000`, `e\n1`, `e\u007f`, `\u0085`} {
			requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"`+id+`","amount_cents":1}`), "event_id")
		}
	})

	t.Run("FieldNamesAreCaseSensitive", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		p := requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1,"AMOUNT_CENTS":100000}`), "AMOUNT_CENTS")
		require.Len(t, p.Errors, 1)
		requireInvalid(t, b.requireEventRejected(t, `{"Customer_ID":"acme","event_id":"e1","amount_cents":1}`), "Customer_ID")
	})

	t.Run("IdempotencyConflict", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("e1", 100)).Code)
		for _, body := range []string{
			eventJSON("e1", 101),
			`{"customer_id":"acme","event_id":"e1","amount_cents":100}`, // metric left out
			`{"customer_id":"acme","event_id":"e1","amount_cents":100,"metric":"api_calls","occurred_at":"2026-11-14T10:30:00Z"}`,
		} {
			p := requireProblem(t, b.requireEventRejected(t, body), http.StatusConflict, "idempotency_conflict")
			require.Contains(t, p.Detail, "e1")
		}
	})

	t.Run("MalformedJSON", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, body := range []string{`{"customer_id":"acme",`, `[`, eventJSON("e1", 1) + `{}`, `{"customer_id":'acme'}`} {
			requireProblem(t, b.requireEventRejected(t, body), http.StatusBadRequest, "malformed_json")
		}
	})

	t.Run("OccurredAtInClosedPeriod", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		// October closed at 2026-11-01T01:00Z; the clock is at 2026-11-14.
		body := `{"customer_id":"acme","event_id":"late","amount_cents":1,"occurred_at":"2026-10-31T23:00:00Z"}`
		p := requireProblem(t, b.requireEventRejected(t, body), http.StatusConflict, "period_closed")
		require.Contains(t, p.Detail, "period 2026-10 of customer acme stopped taking events at 2026-11-01T01:00:00Z")
		require.Contains(t, p.Detail, "post the event again with an occurred_at in a period still open, such as now (2026-11-14T10:30:00Z)")
	})

	t.Run("OccurredAtInFuture", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		at := func(d time.Duration) string {
			return fmt.Sprintf(`{"customer_id":"acme","event_id":"e%d","amount_cents":1,"occurred_at":%q}`,
				d, ledgertest.ClockStart.Add(d).Format(time.RFC3339))
		}
		requireInvalid(t, b.requireEventRejected(t, at(5*time.Minute+time.Second)), "occurred_at")
		requireInvalid(t, b.requireEventRejected(t, at(24*time.Hour)), "occurred_at")

		rec := b.postEvent(at(4 * time.Minute))
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
	})

	t.Run("OccurredAtNotRFC3339", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, v := range []string{`"2026-11-14 10:00:00"`, `"2026-11-14"`, `"yesterday"`, `""`} {
			body := `{"customer_id":"acme","event_id":"e1","amount_cents":1,"occurred_at":` + v + `}`
			requireInvalid(t, b.requireEventRejected(t, body), "occurred_at")
		}
		body := `{"customer_id":"acme","event_id":"e1","amount_cents":1,"occurred_at":1763116200}`
		requireInvalid(t, b.requireEventRejected(t, body), "occurred_at")
	})

	t.Run("PeriodClosed", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		first := b.postEvent(eventJSON("e1", 100))
		require.Equal(t, http.StatusCreated, first.Code)
		_, err := b.Pool.Exec(ctx, `UPDATE billing.periods SET status = 'closed', closed_at = '2026-11-14T10:00:00Z'`)
		require.NoError(t, err)

		p := requireProblem(t, b.requireEventRejected(t, eventJSON("e2", 100)), http.StatusConflict, "period_closed")
		require.Contains(t, p.Detail, "period 2026-11 of customer acme was closed at 2026-11-14T10:00:00Z")
		require.NotContains(t, p.Detail, "2026-12-01T01:00:00Z", "not its scheduled close time")
		require.Contains(t, p.Detail, "or without occurred_at (it defaults to now)")

		// An acknowledged event still replays.
		replay := b.postEvent(eventJSON("e1", 100))
		require.Equal(t, http.StatusOK, replay.Code, "body: %s", replay.Body)
		require.Equal(t, first.Body.String(), replay.Body.String())
	})

	t.Run("PropertiesNotAnObject", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, v := range []string{`[1]`, `"x"`, `3`} {
			requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1,"properties":`+v+`}`), "properties")
		}
	})

	t.Run("PropertiesWithNUL", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, props := range []string{`{"a":"x\u0000y"}`, `{"\u0000":1}`, `{"a":{"b":["\u0000"]}}`} {
			requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1,"properties":`+props+`}`), "properties")
		}
	})

	t.Run("QuantityNegative", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1,"quantity":-1}`), "quantity")
		requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1,"quantity":1.5}`), "quantity")
	})

	t.Run("Replay", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		body := `{"customer_id":"acme","event_id":"e1","amount_cents":100,"metric":"api_calls","properties":{"b":1,"a":[1,2]}}`
		first := b.postEvent(body)
		require.Equal(t, http.StatusCreated, first.Code, "body: %s", first.Body)

		b.Clock.Advance(time.Minute)
		before := b.rows(t)
		for _, again := range []string{
			body,
			// The same payload, reordered and respaced.
			`{ "properties": {"a":[1, 2], "b":1}, "metric":"api_calls", "amount_cents":100, "event_id":"e1", "customer_id":"acme" }`,
		} {
			rec := b.postEvent(again)
			require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
			require.Equal(t, "true", rec.Header().Get("Idempotent-Replayed"))
			require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			require.True(t, bytes.Equal(first.Body.Bytes(), rec.Body.Bytes()), "first:\n%s\nreplay:\n%s", first.Body, rec.Body)
		}
		require.Equal(t, before, b.rows(t))
	})

	t.Run("UnknownCustomer", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		p := requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"ghost","event_id":"e1","amount_cents":1}`), "customer_id")
		require.Contains(t, p.Errors["customer_id"], "ghost")
	})

	t.Run("UnknownField", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		p := requireInvalid(t, b.requireEventRejected(t, `{"customer_id":"acme","event_id":"e1","amount_cents":1,"amount":1}`), "amount")
		require.Len(t, p.Errors, 1)
	})

	t.Run("UnsupportedMediaType", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, ct := range []string{"", "text/plain", "application/jsonx", "multipart/form-data; boundary=x"} {
			req := b.newRequest(http.MethodPost, "/v1/usage-events", eventJSON("e1", 1))
			req.Header.Set("Content-Type", ct)
			requireProblem(t, b.requireNothingWritten(t, req), http.StatusUnsupportedMediaType, "unsupported_media_type")
		}
		req := b.newRequest(http.MethodPost, "/v1/usage-events", eventJSON("e1", 1))
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		require.Equal(t, http.StatusCreated, b.serve(req).Code)
	})
}
