package api

import (
	"net/url"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tally-billing/tally/internal/ledger"
)

// paramMaxBytes is the longest query parameter or path id the API passes on:
// the ledger stores no id longer than 255 bytes.
const paramMaxBytes = 255

// validParam reports whether s could be an id or label the ledger stores: at
// most 255 bytes of UTF-8 without control characters (the ledger's rule for
// ids). Anything else could never match, and Postgres refuses some of it
// (NUL, invalid UTF-8).
func validParam(s string) bool {
	if len(s) > paramMaxBytes || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// queryParams reads a request's query parameters into field messages, so a
// handler answers every bad parameter at once, by name, with 422.
type queryParams struct {
	values url.Values
	fields map[string]string
}

func newQueryParams(u *url.URL) *queryParams {
	return &queryParams{values: u.Query(), fields: map[string]string{}}
}

// str returns parameter name, or "" (with a message) when it is not a valid
// parameter (validParam).
func (q *queryParams) str(name string) string {
	v := q.values.Get(name)
	if !validParam(v) {
		q.fields[name] = "must be at most 255 bytes of UTF-8 text without control characters"
		return ""
	}
	return v
}

// integer returns parameter name as a whole number between min and max, def
// when it is absent, or def with a message saying what to send.
func (q *queryParams) integer(name string, def, min, max int64, want string) int64 {
	v := q.values.Get(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < min || n > max {
		q.fields[name] = want
		return def
	}
	return n
}

// err returns a *ledger.ValidationError naming every bad parameter, or nil.
func (q *queryParams) err() error {
	if len(q.fields) == 0 {
		return nil
	}
	return &ledger.ValidationError{Fields: q.fields}
}

// time returns parameter name as an RFC 3339 time, the zero time when it is
// absent, or the zero time with a message saying what to send.
func (q *queryParams) time(name string) time.Time {
	v := q.values.Get(name)
	if v == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		q.fields[name] = "must be an RFC 3339 time, such as 2026-11-03T00:00:00Z"
		return time.Time{}
	}
	return t
}
