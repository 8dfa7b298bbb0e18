package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// apiKey creates a key with scopes and returns its secret.
func (b *testBundle) apiKey(ctx context.Context, t *testing.T, name string, scopes ...ledger.Scope) string {
	t.Helper()
	secret, _, err := b.Ledger.APIKeyCreate(ctx, name, scopes)
	require.NoError(t, err)
	return secret
}

// newRequest returns a request authenticated with the all-scopes key, with a
// JSON content type when it has a body.
func (b *testBundle) newRequest(method, path, body string) *http.Request {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+b.secret)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

func (b *testBundle) serve(req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	return rec
}

// do serves method path with body through newRequest.
func (b *testBundle) do(method, path, body string) *httptest.ResponseRecorder {
	return b.serve(b.newRequest(method, path, body))
}

// rows counts what a request may write.
type rows struct {
	Customers int64
	Events    int64
	Periods   int64
	Jobs      int64
}

func (b *testBundle) rows(t *testing.T) rows {
	t.Helper()
	return rows{
		Customers: b.Count(t, "SELECT count(*) FROM billing.customers"),
		Events:    b.Count(t, "SELECT count(*) FROM billing.usage_events"),
		Periods:   b.Count(t, "SELECT count(*) FROM billing.periods"),
		Jobs:      b.Count(t, "SELECT count(*) FROM river.river_job"),
	}
}

// requireNothingWritten serves req and requires that it wrote no row, and
// returns the response.
func (b *testBundle) requireNothingWritten(t *testing.T, req *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	before := b.rows(t)
	rec := b.serve(req)
	require.Equal(t, before, b.rows(t), "a rejected request wrote rows; response: %d %s", rec.Code, rec.Body)
	return rec
}

// problemBody is an RFC 9457 problem as the API writes it.
type problemBody struct {
	Type      string            `json:"type"`
	Title     string            `json:"title"`
	Status    int               `json:"status"`
	Detail    string            `json:"detail"`
	Code      string            `json:"code"`
	Errors    map[string]string `json:"errors"`
	Items     []itemProblemBody `json:"items"`
	Omitted   int               `json:"omitted"`
	RequestID string            `json:"request_id"`
}

type itemProblemBody struct {
	Index   int               `json:"index"`
	Status  int               `json:"status"`
	Code    string            `json:"code"`
	Detail  string            `json:"detail"`
	Errors  map[string]string `json:"errors"`
	Omitted int               `json:"omitted"`
}

// requireProblem requires rec to be a problem+json response with status and
// code, and returns it.
func requireProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) problemBody {
	t.Helper()
	require.Equal(t, status, rec.Code, "body: %s", rec.Body)
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	var p problemBody
	dec := json.NewDecoder(rec.Body)
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&p))
	require.Equal(t, status, p.Status)
	require.Equal(t, code, p.Code)
	require.Equal(t, "urn:tally:problem:"+code, p.Type)
	require.Equal(t, http.StatusText(status), p.Title)
	require.NotEmpty(t, p.Detail)
	require.Equal(t, rec.Header().Get("X-Request-Id"), p.RequestID)
	return p
}

// requireInvalid requires a 422 validation_error that names field, and
// returns it.
func requireInvalid(t *testing.T, rec *httptest.ResponseRecorder, field string) problemBody {
	t.Helper()
	p := requireProblem(t, rec, http.StatusUnprocessableEntity, "validation_error")
	require.Contains(t, p.Errors, field, "errors: %v", p.Errors)
	require.NotEmpty(t, p.Errors[field])
	return p
}

// decodeJSON decodes rec's JSON body into a T.
func decodeJSON[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var v T
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &v), "body: %s", rec.Body)
	return v
}

// eventJSON is a valid usage event of acme.
func eventJSON(eventID string, amountCents int64) string {
	return fmt.Sprintf(`{"customer_id":"acme","event_id":%q,"amount_cents":%d,"metric":"api_calls"}`, eventID, amountCents)
}
