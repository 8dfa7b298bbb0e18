package pricing

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ValidationError names every field of a plan that cannot be accepted. Its
// Fields map a field's path (such as "prices.api_calls.tiers[1].up_to") to
// what is wrong with it and what to send instead; the shape matches
// ledger.ValidationError, so the API can answer it as a 422 unchanged.
type ValidationError struct {
	Fields map[string]string
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("invalid plan:")
	for i, path := range slices.Sorted(maps.Keys(e.Fields)) {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " %s: %s", path, e.Fields[path])
	}
	return b.String()
}

// ErrMalformedPlan is returned, wrapped, by ParsePlan when its input is not
// one JSON object; the caller answers it like any malformed body.
var ErrMalformedPlan = errors.New(`a plan must be one JSON object, such as {"currency":"usd","prices":{"api_calls":{"model":"per_unit","unit_amount":"0.025"}}}`)

// fieldErrors collects one message per field path.
type fieldErrors map[string]string

func (f fieldErrors) add(path, format string, args ...any) {
	if _, ok := f[path]; !ok {
		f[path] = fmt.Sprintf(format, args...)
	}
}

func (f fieldErrors) err() error {
	if len(f) == 0 {
		return nil
	}
	return &ValidationError{Fields: f}
}
