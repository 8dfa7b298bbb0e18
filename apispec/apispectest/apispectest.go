// Package apispectest holds an HTTP handler to Tally's OpenAPI document
// (apispec, apispec/openapi.yaml) in tests: Handler checks every response the
// handler writes, and every request it accepts, against the document and
// fails the test on a mismatch. It is for tests only; nothing in the server
// imports it.
package apispectest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	liberrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

	apispec "github.com/tally-billing/tally/apispec"
)

// Contract is the OpenAPI document, loaded once and ready to check responses
// against. It is safe for concurrent use.
type Contract struct {
	// Model is the document's model.
	Model *v3.Document

	validator validator.Validator // responses, strictly
	requests  validator.Validator // requests, by their schemas alone
	schemas   schema_validation.SchemaValidator

	// router routes a request as the server's ServeMux does, to the
	// documented operation's path template; built from the document, so it
	// routes what the document says the server routes.
	router *http.ServeMux
}

var (
	contractOnce sync.Once
	contract     *Contract
	contractErr  error
)

// mapKeys are where responses hold maps (additionalProperties with a
// schema), whose keys are data, not fields: strict mode would report each key
// as undeclared. A map added to the document needs its place here.
var mapKeys = []string{
	"$.body.errors**", "$.body.items[*].errors**", // Problem, BatchItemProblem
	"$.body.carried_forward_cents**",                           // Customer
	"$.body.properties**", "$.body.data[*].event.properties**", // UsageEvent
	"$.body.actions[*].detail**",                                                // OperatorAction
	"$.body.prices**", "$.body.versions[*].prices**", "$.body.data[*].prices**", // PlanVersion, Plan, PlanPage
}

// int64Format replaces libopenapi-validator's int64 format check, which
// refuses the largest int64: bodies are decoded into float64s, where
// 9223372036854775807 (a quantity the API stores and answers) is 2^63, and
// v0.16.2 compares it with float64(math.MaxInt64)+1, which is 2^63 too. A
// float64 cannot tell the two apart, so 2^63 is taken.
func int64Format(v any) error {
	switch n := v.(type) {
	case float64:
		if n != math.Trunc(n) || n < math.MinInt64 || n > 1<<63 {
			return fmt.Errorf("must be a whole number from %d to %d", int64(math.MinInt64), int64(math.MaxInt64))
		}
	case json.Number:
		if _, err := n.Int64(); err != nil {
			return fmt.Errorf("must be a whole number from %d to %d", int64(math.MinInt64), int64(math.MaxInt64))
		}
	}
	return nil
}

// Load returns the Contract of apispec's document, parsing it on the first
// call. The validator checks formats (date-time, …) and, beyond the
// schemas, that a response holds no property the document does not declare
// (strict mode), so the document lists every field the API answers.
func Load() (*Contract, error) {
	contractOnce.Do(func() { contract, contractErr = load(apispec.Document()) })
	return contract, contractErr
}

func load(spec []byte) (*Contract, error) {
	doc, err := libopenapi.NewDocument(spec)
	if err != nil {
		return nil, fmt.Errorf("error parsing the OpenAPI document: %w", err)
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		return nil, fmt.Errorf("error building the OpenAPI document's model: %w", err)
	}
	formats := []config.Option{config.WithFormatAssertions(), config.WithCustomFormat("int64", int64Format)}
	strict := append([]config.Option{config.WithStrictMode(), config.WithStrictIgnorePaths(mapKeys...)}, formats...)
	c := &Contract{
		Model:     &model.Model,
		validator: validator.NewValidatorFromV3Model(&model.Model, strict...),
		// Not strict: the API ignores query parameters it does not know,
		// and a request body's maps hold anything. Not the security
		// requirements either: TestOpenAPI holds them to routes.go, and the
		// answers of the auth tests are checked like any other.
		requests: validator.NewValidatorFromV3Model(&model.Model, append(formats, config.WithoutSecurityValidation())...),
		schemas:  schema_validation.NewSchemaValidator(strict...),
		router:   http.NewServeMux(),
	}
	for template, item := range model.Model.Paths.PathItems.FromOldest() {
		for method := range item.GetOperations().FromOldest() {
			c.router.Handle(strings.ToUpper(method)+" "+template, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.(*routeProbe).template = template
			}))
		}
	}
	return c, nil
}

// routeProbe is where Contract.router answers: the path template of the
// documented operation it routed to, or what the ServeMux answered itself (a
// redirect to the canonical path, 404, 405).
type routeProbe struct {
	*httptest.ResponseRecorder
	template string
}

// route returns where the server's ServeMux sends r, by the document.
func (c *Contract) route(r *http.Request) *routeProbe {
	p := &routeProbe{ResponseRecorder: httptest.NewRecorder()}
	c.router.ServeHTTP(p, r.Clone(r.Context())) // the ServeMux sets the request's pattern: not on r
	return p
}

// Handler returns h with every response it writes checked against the
// document; a mismatch fails t (t.Errorf, so h may run on another goroutine,
// as behind httptest.NewServer). A request the document routes to an
// operation must get a status that operation documents, with a documented
// content type, a body its schema takes (and no undeclared property), and its
// required headers; a problem+json body must also name its status, request id
// and code (type urn:tally:problem:<code>) consistently. A request the
// document routes nowhere must get what the server's catch-all answers, 404
// not_found, or the ServeMux's redirect to the canonical path. And a request
// h accepts (2xx) must be one the document allows: its parameters and body
// must pass the document's schemas (h is the whole server, so what it accepts
// is what the API accepts).
func Handler(t testing.TB, h http.Handler) http.Handler {
	t.Helper()
	return handler(t, h, true)
}

// ResponseHandler is Handler without the check of the requests h accepts: for
// a handler whose ledger is stubbed (internal/api's fuzz targets), which
// accepts requests the API refuses.
func ResponseHandler(t testing.TB, h http.Handler) http.Handler {
	t.Helper()
	return handler(t, h, false)
}

func handler(t testing.TB, h http.Handler, requests bool) http.Handler {
	t.Helper()
	c, err := Load()
	if err != nil {
		t.Fatalf("error loading the OpenAPI document: %v", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := c.route(r)
		var sent []byte
		if r.Body != nil {
			sent, _ = io.ReadAll(r.Body) // what cannot be read is not sent
			r.Body = io.NopCloser(bytes.NewReader(sent))
		}
		rec := &responseTee{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		resp := rec.response(r)
		defer resp.Body.Close()
		if problems := c.check(r, route, resp); len(problems) > 0 {
			t.Errorf("%s %s answered %d %s, which apispec/openapi.yaml does not allow:\n  %s\nbody: %.2000s",
				r.Method, r.URL.RequestURI(), resp.StatusCode, resp.Header.Get("Content-Type"),
				strings.Join(problems, "\n  "), rec.body.Bytes())
		}
		if !requests {
			return
		}
		if problems := c.checkAccepted(r, route, resp, sent); len(problems) > 0 {
			t.Errorf("%s %s was accepted (%d), but apispec/openapi.yaml does not allow the request:\n  %s\nrequest body: %.2000s",
				r.Method, r.URL.RequestURI(), resp.StatusCode, strings.Join(problems, "\n  "), sent)
		}
	})
}

// checkAccepted returns what the document does not allow in a request (sent
// its body) that the server accepted with a 2xx answer, or nothing: the
// document's parameters and request bodies must take what the server takes.
func (c *Contract) checkAccepted(r *http.Request, route *routeProbe, resp *http.Response, sent []byte) []string {
	if route.template == "" || resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil
	}
	req := r.Clone(r.Context())
	req.Body = io.NopCloser(bytes.NewReader(sent))
	// The API reads a query parameter's first value, and an empty one is the
	// same as none (the document says so; OpenAPI's allowEmptyValue, which
	// the validator ignores, is deprecated).
	query := req.URL.Query()
	for name, values := range query {
		if values[0] == "" {
			delete(query, name)
		} else {
			query[name] = values[:1]
		}
	}
	req.URL.RawQuery = query.Encode()
	item := c.Model.Paths.PathItems.GetOrZero(route.template)
	if ok, errs := c.requests.ValidateHttpRequestSyncWithPathItem(req, item, route.template); !ok {
		return describe(errs)
	}
	return nil
}

// check returns what is wrong with resp as the answer to r (routed by route),
// or nothing.
func (c *Contract) check(r *http.Request, route *routeProbe, resp *http.Response) []string {
	var problems []string
	body, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	switch {
	case route.template != "":
		item := c.Model.Paths.PathItems.GetOrZero(route.template)
		if ok, errs := c.validator.GetResponseBodyValidator().ValidateResponseBodyWithPathItem(r, resp, item, route.template); !ok {
			problems = append(problems, describe(errs)...)
		}
	case route.Code == http.StatusMovedPermanently || route.Code == http.StatusTemporaryRedirect || route.Code == http.StatusPermanentRedirect:
		// The ServeMux's own redirect to the canonical path (no route sees
		// the request), outside the document.
		want := route.Header().Get("Location")
		if resp.StatusCode != route.Code || resp.Header.Get("Location") != want {
			problems = append(problems, fmt.Sprintf("want the ServeMux's redirect, %d to %q", route.Code, want))
		}
		return problems
	default:
		// No documented operation: the catch-all's 404 not_found.
		if resp.StatusCode != http.StatusNotFound {
			problems = append(problems, fmt.Sprintf("no operation of the document takes %s %s (the ServeMux answers %d): want 404 not_found",
				r.Method, r.URL.Path, route.Code))
		}
		notFound := c.Model.Components.Responses.GetOrZero("NotFound").Content.GetOrZero("application/problem+json")
		if ok, errs := c.schemas.ValidateSchemaBytes(notFound.Schema.Schema(), body); !ok {
			problems = append(problems, describe(errs)...)
		}
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/problem+json" {
		problems = append(problems, checkProblem(resp, body)...)
	}
	return problems
}

// checkProblem checks what a schema cannot: that a problem's status, type
// and request id agree with its code and its response.
func checkProblem(resp *http.Response, body []byte) []string {
	var p struct {
		Type      string `json:"type"`
		Status    int    `json:"status"`
		Code      string `json:"code"`
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return []string{"the problem is not a JSON object: " + err.Error()}
	}
	var problems []string
	if p.Status != resp.StatusCode {
		problems = append(problems, fmt.Sprintf("the problem's status is %d, the response's %d", p.Status, resp.StatusCode))
	}
	if p.Type != "urn:tally:problem:"+p.Code {
		problems = append(problems, fmt.Sprintf("the problem's type %q does not name its code %q", p.Type, p.Code))
	}
	if id := resp.Header.Get("X-Request-Id"); p.RequestID != id {
		problems = append(problems, fmt.Sprintf("the problem's request_id %q is not the X-Request-Id %q", p.RequestID, id))
	}
	return problems
}

// describe renders the validator's errors, one line per failure.
func describe(errs []*liberrors.ValidationError) []string {
	var lines []string
	for _, e := range errs {
		line := e.Message
		if e.Reason != "" {
			line += ": " + e.Reason
		}
		lines = append(lines, line)
		for _, f := range e.SchemaValidationErrors {
			lines = append(lines, fmt.Sprintf("  at %s (schema %s): %s", f.FieldPath, f.KeywordLocation, f.Reason))
		}
	}
	return lines
}

// responseTee passes a response on to the ResponseWriter it wraps and keeps
// a copy: the status, the header as it was sent, and the body.
type responseTee struct {
	http.ResponseWriter
	status int
	header http.Header
	body   bytes.Buffer
}

func (t *responseTee) WriteHeader(code int) {
	if t.status == 0 {
		t.status = code
		t.header = t.ResponseWriter.Header().Clone()
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *responseTee) Write(b []byte) (int, error) {
	if t.status == 0 {
		t.WriteHeader(http.StatusOK)
	}
	t.body.Write(b)
	return t.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the wrapped ResponseWriter.
func (t *responseTee) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// response returns the response as the client got it.
func (t *responseTee) response(r *http.Request) *http.Response {
	if t.status == 0 {
		t.WriteHeader(http.StatusOK)
	}
	return &http.Response{
		StatusCode: t.status, Status: fmt.Sprintf("%d %s", t.status, http.StatusText(t.status)),
		Header: t.header, Body: io.NopCloser(bytes.NewReader(t.body.Bytes())), Request: r,
		ContentLength: int64(t.body.Len()),
	}
}
