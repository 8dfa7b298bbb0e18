// Package envconf reads settings from the environment and collects every
// problem found, each naming its variable, so that a process refuses to
// start once with the whole list. An empty variable means its default.
package envconf

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Reader reads variables through Getenv and collects problems.
type Reader struct {
	Getenv func(string) string
	errs   []error
}

// New returns a Reader of getenv.
func New(getenv func(string) string) *Reader { return &Reader{Getenv: getenv} }

// Bad records a problem with variable name.
func (r *Reader) Bad(name, format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
}

// Add records err (nil is ignored), such as the problems of another Reader.
func (r *Reader) Add(err error) {
	if err != nil {
		r.errs = append(r.errs, err)
	}
}

// Err returns every problem recorded, joined, or nil.
func (r *Reader) Err() error { return errors.Join(r.errs...) }

// String returns name's value, trimmed, or def when it is empty.
func (r *Reader) String(name, def string) string {
	if v := strings.TrimSpace(r.Getenv(name)); v != "" {
		return v
	}
	return def
}

// Duration returns name as a positive Go duration, or def.
func (r *Reader) Duration(name string, def time.Duration) time.Duration {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		r.Bad(name, "%q is not a positive Go duration such as 90s, 30m or 1h", v)
		return def
	}
	return d
}

// Int returns name as a whole number in [min, max], or def.
func (r *Reader) Int(name string, def, min, max int64) int64 {
	v := r.String(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < min || n > max {
		r.Bad(name, "%q is not a whole number between %d and %d", v, min, max)
		return def
	}
	return n
}

// Bool returns name as true (true, 1, yes) or false (false, 0, no; the
// default).
func (r *Reader) Bool(name string) bool {
	switch v := strings.ToLower(r.String(name, "false")); v {
	case "true", "1", "yes":
		return true
	case "false", "0", "no":
	default:
		r.Bad(name, "%q is not true or false", v)
	}
	return false
}
