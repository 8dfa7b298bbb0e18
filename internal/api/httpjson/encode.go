// Package httpjson is the API's JSON wire format, shared by package api and
// the handlers of what strangers post (internal/api/ingest): strict decoding
// of request bodies (Decode, DecodeStrict), answers (Encode), RFC 9457
// problem details (Problem, WriteProblem) with the mapping of the ledger's
// errors to them (WriteError), and the request id every answer carries
// (WithRequestID). It imports internal/ledger and internal/pricing for their
// errors, never internal/api.
package httpjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tally-billing/tally/internal/api/jsonobj"
	"github.com/tally-billing/tally/internal/ledger"
)

// Body limits, in bytes.
const (
	// BodyLimitDefault bounds a request body.
	BodyLimitDefault = 1 << 20 // 1 MiB

	// BodyLimitBatch bounds the body of a batch of usage events.
	BodyLimitBatch = 8 << 20 // 8 MiB
)

// Encode writes v as JSON with status, in one write with its
// Content-Length (a batch's answer is hundreds of kilobytes: streamed, it
// would go out in chunks of 4 KiB, a system call each).
func Encode(w http.ResponseWriter, status int, v any) {
	buf := encodeBuffers.Get().(*bytes.Buffer)
	defer encodeBufferPut(buf)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Unreachable for the API's own types; answer what the handler meant
		// without a body rather than half of one.
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// encodeBuffers keeps answers' buffers between requests: a batch's answer
// grown from nothing by doubling cost an eighth of the server's allocations.
var encodeBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// encodeBufferKeep is the largest buffer put back in encodeBuffers (a full
// batch's answer is about 300 KiB); larger ones are left to the collector.
const encodeBufferKeep = 1 << 20

func encodeBufferPut(buf *bytes.Buffer) {
	if buf.Cap() > encodeBufferKeep {
		return
	}
	buf.Reset()
	encodeBuffers.Put(buf)
}

// DecodeError is a request body that cannot be decoded; WriteError answers
// it as a problem with its fields.
type DecodeError struct {
	Status  int
	Code    string
	Detail  string
	Fields  map[string]string
	Omitted int // field problems found beyond those in Fields
}

func (e *DecodeError) Error() string { return e.Detail }

// Decode reads a JSON body of at most limit bytes into v, refusing other
// content types and anything DecodeStrict refuses.
func Decode[T any](w http.ResponseWriter, r *http.Request, limit int64) (T, error) {
	body, err := ReadBody(w, r, limit)
	if err != nil {
		var v T
		return v, err
	}
	return DecodeStrict[T](body, "")
}

// ReadBody reads a JSON body of at most limit bytes, refusing other content
// types; for a body decoded by something other than DecodeStrict.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, &DecodeError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Detail: "send the body as JSON with Content-Type: application/json"}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return nil, JSONError(err, limit, "")
	}
	return body, nil
}

// DecodeStrict decodes one JSON object into v. Field names must match v's
// json tags exactly (encoding/json alone would accept "AMOUNT_CENTS" for
// amount_cents, and let a later duplicate win), each at most once; wrong types
// and trailing data are refused. Field names in errors get prefix; at most
// problemErrorsMax are named, the others counted.
func DecodeStrict[T any](raw []byte, prefix string) (T, error) {
	var v T
	keys := keyCheck{allowed: jsonFieldNames(reflect.TypeOf(v)), prefix: prefix}
	if jsonobj.Keys(raw, keys.check) {
		// One valid JSON object: once its keys are v's fields, each once,
		// nothing is left for a Decoder to refuse but wrong types, which
		// Unmarshal reports alike, without a Decoder's buffers (a batch
		// decodes a thousand items).
		if err := keys.err(); err != nil {
			return v, err
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return v, JSONError(err, 0, prefix)
		}
		return v, nil
	}
	if err := checkKeys(raw, keys, prefix); err != nil {
		return v, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, JSONError(err, 0, prefix)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return v, &DecodeError{Status: http.StatusBadRequest, Code: "malformed_json",
			Detail: "the body must hold exactly one JSON value"}
	}
	return v, nil
}

// checkKeys requires raw to be a JSON object whose keys keys accepts. It is
// DecodeStrict's slow path, for a body its one-scan check (jsonobj.Keys)
// refused — invalid JSON, or not an object: it reads raw token by token to
// name the problem.
func checkKeys(raw []byte, keys keyCheck, prefix string) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return JSONError(err, 0, prefix)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		if prefix == "" {
			return &DecodeError{Status: http.StatusBadRequest, Code: "malformed_json", Detail: "the body must be a JSON object"}
		}
		return &DecodeError{Status: http.StatusUnprocessableEntity, Code: "validation_error",
			Detail: "the request has invalid fields", Fields: map[string]string{strings.TrimSuffix(prefix, "."): "must be a JSON object"}}
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return JSONError(err, 0, prefix)
		}
		key, _ := tok.(string)
		keys.check([]byte(key))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return JSONError(err, 0, prefix)
		}
	}
	return keys.err()
}

// keyCheck judges an object's keys, one at a time, against the JSON names of
// a type's fields: a key must be one of them, spelled exactly, and appear
// once. It names at most problemErrorsMax bad keys (cut to fieldNameMax) and
// counts the others, so an object of a million unknown keys costs no more to
// hold and answer than one of ten.
type keyCheck struct {
	allowed map[string]bool
	prefix  string
	seen    []string // the allowed keys met so far
	fields  map[string]string
	omitted int
}

// check judges key.
func (c *keyCheck) check(key []byte) {
	if c.allowed[string(key)] {
		for _, s := range c.seen {
			if s == string(key) {
				c.add(key, "appears more than once; send each field once")
				return
			}
		}
		c.seen = append(c.seen, string(key))
		return
	}
	c.add(key, "")
}

// add names key with msg (an unknown key's when empty), unless key is
// named already; it counts key in omitted once problemErrorsMax are named.
func (c *keyCheck) add(key []byte, msg string) {
	name := fieldName(c.prefix + string(key))
	if _, ok := c.fields[name]; ok {
		return
	}
	if len(c.fields) == problemErrorsMax {
		c.omitted++
		return
	}
	if msg == "" {
		msg = "is not a known field; remove it (see the API reference in README.md)"
		for allowed := range c.allowed {
			if strings.EqualFold(allowed, string(key)) {
				msg = fmt.Sprintf("is not a known field: names are case-sensitive; send %q", allowed)
			}
		}
	}
	if c.fields == nil {
		c.fields = map[string]string{}
	}
	c.fields[name] = msg
}

// err returns the problem of the keys checked, or nil.
func (c *keyCheck) err() error {
	if len(c.fields) == 0 {
		return nil
	}
	return &DecodeError{Status: http.StatusUnprocessableEntity, Code: "validation_error",
		Detail: "the request has invalid fields", Fields: c.fields, Omitted: c.omitted}
}

// fieldNames caches jsonFieldNames by type.
var fieldNames sync.Map // reflect.Type → map[string]bool

// jsonFieldNames returns the JSON names of a struct type's fields.
func jsonFieldNames(t reflect.Type) map[string]bool {
	if names, ok := fieldNames.Load(t); ok {
		return names.(map[string]bool)
	}
	names := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names[name] = true
	}
	fieldNames.Store(t, names)
	return names
}

// JSONError turns an error of reading or decoding a JSON body into a
// DecodeError that names the field, with prefix, when there is one; a body
// over its limit (an *http.MaxBytesError) is answered 413 naming limit.
func JSONError(err error, limit int64, prefix string) *DecodeError {
	var maxErr *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &maxErr):
		return &DecodeError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
			Detail: fmt.Sprintf("the body is larger than %d bytes; send less per request", limit)}
	case errors.As(err, &typeErr):
		field := prefix + typeErr.Field
		return &DecodeError{Status: http.StatusUnprocessableEntity, Code: "validation_error",
			Detail: "the request has invalid fields",
			Fields: map[string]string{field: fmt.Sprintf("must be %s, not a JSON %s", describeType(typeErr), typeErr.Value)}}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &DecodeError{Status: http.StatusUnprocessableEntity, Code: "validation_error",
			Detail: "the request has invalid fields",
			Fields: map[string]string{prefix + field: "is not a known field; remove it (see the API reference in README.md)"}}
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return &DecodeError{Status: http.StatusBadRequest, Code: "malformed_json",
			Detail: "the body is not valid JSON: " + err.Error()}
	}
	return &DecodeError{Status: http.StatusBadRequest, Code: "malformed_json", Detail: "the body could not be read: " + err.Error()}
}

func describeType(e *json.UnmarshalTypeError) string {
	switch e.Type.Kind().String() {
	case "int64", "int", "int32":
		if e.Value == "number" {
			return "a whole number that fits in 64 bits"
		}
		return "a whole number"
	case "string":
		return "a string"
	case "map", "struct":
		return "a JSON object"
	case "slice":
		return "a JSON array"
	case "bool":
		return "true or false"
	}
	return "of type " + e.Type.String()
}

// Bounds on what a problem lists, so that an answer stays a few KiB whatever
// was sent (a field problem per key would answer an event of 1 MiB of
// unknown keys with megabytes): the problems beyond them are counted in the
// problem's omitted (for a batch, the failing events not listed; for an
// event of it, its field problems not listed).
const (
	// problemErrorsMax is the most field problems a problem lists in errors.
	problemErrorsMax = 10

	// ProblemItemsMax is the most failing events a batch's problem lists in
	// items, the first by index.
	ProblemItemsMax = 10

	// ItemErrorsMax is the most field problems listed for one event of a
	// batch.
	ItemErrorsMax = 5

	// fieldNameMax is the longest field name a problem shows, in bytes: a
	// longer one (an unknown key of a MiB, a deep properties path) is cut
	// and ends with "…".
	fieldNameMax = 128
)

// fieldName returns name cut to fieldNameMax bytes, ending with "…" when cut.
func fieldName(name string) string {
	if len(name) <= fieldNameMax {
		return name
	}
	return strings.ToValidUTF8(name[:fieldNameMax-len("…")], "") + "…"
}

// FieldsListed returns at most max of fields (the first names in byte
// order, each cut by fieldName) and how many it left out.
func FieldsListed(fields map[string]string, max int) (map[string]string, int) {
	short := len(fields) <= max
	for name := range fields {
		short = short && len(name) <= fieldNameMax
	}
	if short {
		return fields, 0
	}
	names := slices.Sorted(maps.Keys(fields))
	listed := make(map[string]string, min(max, len(names)))
	for _, name := range names[:min(max, len(names))] {
		listed[fieldName(name)] = fields[name]
	}
	return listed, len(names) - min(max, len(names))
}

// Problem is an RFC 9457 problem detail.
type Problem struct {
	Type      string            `json:"type"`
	Title     string            `json:"title"`
	Status    int               `json:"status"`
	Detail    string            `json:"detail,omitempty"`
	Code      string            `json:"code"`
	Errors    map[string]string `json:"errors,omitempty"`
	Items     []ItemProblem     `json:"items,omitempty"`
	Omitted   int               `json:"omitted,omitempty"`
	RequestID string            `json:"request_id,omitempty"`
}

// ItemProblem is the error of one item of a batch.
type ItemProblem struct {
	Index   int               `json:"index"`
	Status  int               `json:"status"`
	Code    string            `json:"code"`
	Detail  string            `json:"detail"`
	Errors  map[string]string `json:"errors,omitempty"`
	Omitted int               `json:"omitted,omitempty"`
}

// WriteProblem answers p, listing at most problemErrorsMax of its errors.
func WriteProblem(w http.ResponseWriter, r *http.Request, p Problem) {
	p.Type = "urn:tally:problem:" + p.Code
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	var omitted int
	p.Errors, omitted = FieldsListed(p.Errors, problemErrorsMax)
	p.Omitted += omitted
	if p.Omitted > 0 {
		p.Detail += fmt.Sprintf(" (%d more are not listed: see omitted)", p.Omitted)
	}
	p.RequestID = RequestIDFrom(r.Context())
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(p)
}

// unavailableRetryAfter is the Retry-After of a 503 database_unavailable,
// in seconds: about what a restart or a failover of Postgres takes to come
// back, or PgBouncer to try logging in again.
const unavailableRetryAfter = "1"

// WriteInternal logs err with the request's context and answers a generic
// 500 that names only the request id — or, when err is Postgres out of
// reach (ledger.Unavailable), a 503 database_unavailable with Retry-After:
// nothing was acknowledged, and the same request again is safe.
func WriteInternal(logger *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	if ledger.Unavailable(err) {
		logger.WarnContext(r.Context(), "database unavailable", slog.String("error", err.Error()),
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("request_id", RequestIDFrom(r.Context())))
		w.Header().Set("Retry-After", unavailableRetryAfter)
		WriteProblem(w, r, Problem{Status: http.StatusServiceUnavailable, Code: "database_unavailable",
			Detail: "Postgres is out of reach for the moment: this request was not acknowledged; send it again (the same event id, the same key), which is safe"})
		return
	}
	logger.ErrorContext(r.Context(), "internal error", slog.String("error", err.Error()),
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.String("request_id", RequestIDFrom(r.Context())))
	WriteProblem(w, r, Problem{Status: http.StatusInternalServerError, Code: "internal_error",
		Detail: "an internal error occurred; it was logged with this request id"})
}
