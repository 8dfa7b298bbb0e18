package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
)

// bodyLimitWebhook bounds a Stripe event payload.
const bodyLimitWebhook = 1 << 20

// webhookCreatedMax is the latest creation time an event may claim: the end
// of year 9999 (Postgres stores later times, Stripe never sends them).
var webhookCreatedMax = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).Unix()

// StripeWebhook receives Stripe events: it verifies Stripe-Signature
// with the endpoint secret (300 s tolerance), stores the event with record
// (the ledger's StripeEventRecord: the event by its id with its processing
// job, in one transaction), and answers 200 at once. A replayed event id
// answers 200 and stores nothing. A bad or stale signature answers 400
// invalid_signature and stores nothing. A signed event that cannot be stored
// as it is (no id, an id or type over 255 bytes or with control characters,
// a creation time outside years 1970–9999, a payload that is not UTF-8 or
// holds \u0000 or a number Postgres refuses) answers 400 invalid_event, stores nothing and is
// logged at Error: Stripe retries it, and an operator must look. Without a
// secret configured every event is refused with 503, so Stripe keeps
// retrying until one is set.
func StripeWebhook(logger *slog.Logger, record func(context.Context, ledger.StripeEventParams) (bool, error), secret string) http.Handler {
	type response struct {
		Received bool `json:"received"`
		Replay   bool `json:"replay"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if secret == "" {
			httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusServiceUnavailable, Code: "webhooks_disabled",
				Detail: "this Tally has no STRIPE_WEBHOOK_SECRET; set it to the endpoint's signing secret (whsec_…)"})
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, bodyLimitWebhook))
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			httpjson.WriteError(logger, w, r, httpjson.JSONError(err, bodyLimitWebhook, ""))
			return
		}
		if err != nil {
			httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusBadRequest, Code: "malformed_body", Detail: "the body could not be read"})
			return
		}
		if err := webhook.ValidatePayloadWithTolerance(body, r.Header.Get("Stripe-Signature"), secret, webhook.DefaultTolerance); err != nil {
			logger.WarnContext(r.Context(), "stripe webhook refused", slog.String("error", err.Error()),
				slog.String("request_id", httpjson.RequestIDFrom(r.Context())))
			httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusBadRequest, Code: "invalid_signature",
				Detail: "the Stripe-Signature header does not verify with this endpoint's secret, or is older than 300 s"})
			return
		}
		event, err := webhook.ConstructEventWithOptions(body, r.Header.Get("Stripe-Signature"), secret,
			webhook.ConstructEventOptions{Tolerance: webhook.DefaultTolerance, IgnoreAPIVersionMismatch: true})
		if err == nil {
			err = checkStripeEvent(event.ID, string(event.Type), event.Created, body)
		}
		if err != nil {
			// Signed, so it came from Stripe (or a holder of the secret):
			// an operator must see it.
			logger.ErrorContext(r.Context(), "stripe webhook event cannot be stored", slog.String("error", err.Error()),
				slog.String("event_id", strconv.QuoteToASCII(truncate(event.ID, 64))),
				slog.String("request_id", httpjson.RequestIDFrom(r.Context())))
			httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusBadRequest, Code: "invalid_event",
				Detail: "the event is signed but cannot be stored: " + err.Error()})
			return
		}
		created, err := record(r.Context(), ledger.StripeEventParams{
			ID: event.ID, Type: string(event.Type), Payload: body, Livemode: event.Livemode,
			CreatedAt: time.Unix(event.Created, 0).UTC(),
		})
		if err != nil {
			httpjson.WriteInternal(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusOK, response{Received: true, Replay: !created})
	})
}

// checkStripeEvent returns an error saying why a verified event cannot be
// stored, or nil.
func checkStripeEvent(id, typ string, created int64, payload []byte) error {
	switch {
	case !ledger.ValidID(id):
		return errors.New("its id must be 1 to 255 bytes of UTF-8 text without control characters")
	case !ledger.ValidID(typ):
		return errors.New("its type must be 1 to 255 bytes of UTF-8 text without control characters")
	case created < 0 || created > webhookCreatedMax:
		return fmt.Errorf("its created time %d is outside years 1970 to 9999", created)
	case !utf8.Valid(payload):
		return errors.New("it is not UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return errors.New("it is not JSON")
	}
	return jsonbStorable(v)
}

// jsonbStorable returns an error when Postgres's jsonb would refuse a decoded
// JSON value: a NUL character in a key or string, or a number beyond what
// numeric holds (checked as: a finite float64, an exponent within ±400, at
// most 16383 digits after the decimal point).
func jsonbStorable(v any) error {
	switch v := v.(type) {
	case string:
		if strings.ContainsRune(v, 0) {
			return errors.New(`it holds the NUL character (\u0000)`)
		}
	case json.Number:
		if !numericStorable(string(v)) {
			return fmt.Errorf("it holds the number %.32s, which Postgres cannot store", v)
		}
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, 0) {
				return errors.New(`it holds the NUL character (\u0000)`)
			}
			if err := jsonbStorable(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range v {
			if err := jsonbStorable(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// numericStorable reports whether Postgres's numeric takes the JSON number s.
func numericStorable(s string) bool {
	if f, err := strconv.ParseFloat(s, 64); err != nil && f != 0 {
		return false // overflow; an underflow is stored as written
	}
	mantissa, exp, _ := strings.Cut(strings.ToLower(s), "e")
	e := 0
	if exp != "" {
		digits := strings.TrimLeft(strings.TrimLeft(exp, "+-"), "0")
		if len(digits) > 3 {
			return false
		}
		e, _ = strconv.Atoi("0" + digits)
		if strings.HasPrefix(exp, "-") {
			e = -e
		}
		if e > 400 || e < -400 {
			return false
		}
	}
	_, frac, _ := strings.Cut(mantissa, ".")
	return len(frac)-e <= 16383
}

// truncate cuts s to at most n bytes.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
