package pricing

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/cockroachdb/apd/v3"
)

// Limits on every decimal a plan holds and every quantity Rate takes. They
// bound the digits of each product and sum well inside the arithmetic's
// precision, so no operation ever rounds (see exact).
const (
	// MaxFractionDigits is the most digits after the point: a quantity event
	// carries at most 12, and so does every amount and tier bound.
	MaxFractionDigits = 12
	// MaxIntegerDigits is the most digits before the point (values below
	// 1e20; an int64 ends near 9.2e18).
	MaxIntegerDigits = 20
	// MaxTiers is the most tiers a graduated or volume price may have.
	MaxTiers = 100
)

// exact is the context of every operation but the one rounding: its
// precision holds any product or sum of values within the limits above
// (at most 32 digits each, a few hundred terms), and Inexact is a trap, so
// an operation that would have to round returns an error instead.
var exact = apd.Context{
	Precision:   100,
	MaxExponent: apd.MaxExponent,
	MinExponent: apd.MinExponent,
	Traps:       apd.DefaultTraps | apd.Inexact,
	Rounding:    apd.RoundDown,
}

// toMinorUnit is the context of the one rounding: a line item's exact amount
// to a whole minor unit, half-up.
var toMinorUnit = apd.Context{
	Precision:   100,
	MaxExponent: apd.MaxExponent,
	MinExponent: apd.MinExponent,
	Traps:       apd.DefaultTraps,
	Rounding:    apd.RoundHalfUp,
}

// decimalSyntax is a JSON number: the spelling a quantity event may send as
// a number or a string, and a plan's decimal strings.
var decimalSyntax = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// ParseQuantity parses s, a quantity as a usage event sends it: a JSON
// number, or the same digits in a string, such as "12.5" or "1e3". The value
// is exact (no float is involved), not negative, and within MaxIntegerDigits
// and MaxFractionDigits (trailing zeros do not count). The error says what
// to send instead.
func ParseQuantity(s string) (apd.Decimal, error) {
	d, problem := parseDecimal(s, "12.5")
	if problem != "" {
		return apd.Decimal{}, errors.New(problem)
	}
	return d, nil
}

// maxDigits bounds the spelling of a decimal and the coefficient of one
// given in Go, before anything costs more than linear time (removing
// trailing zeros is quadratic in the digits).
const maxDigits = 100

// parseDecimal parses s as a non-negative decimal within the limits and
// returns it reduced (no trailing zeros), or a message saying what is wrong
// and what to send instead, with example as the model.
func parseDecimal(s, example string) (apd.Decimal, string) {
	var d apd.Decimal
	if len(s) > maxDigits {
		return d, fmt.Sprintf("is %d characters long; send at most %d, such as %q", len(s), maxDigits, example)
	}
	if !decimalSyntax.MatchString(s) {
		return d, fmt.Sprintf("must be a decimal such as %q; got %q", example, truncate(s))
	}
	if _, _, err := d.SetString(s); err != nil {
		return apd.Decimal{}, fmt.Sprintf("is out of range; send a decimal such as %q", example)
	}
	if problem := checkDecimal(&d); problem != "" {
		return apd.Decimal{}, problem
	}
	return reduced(&d), ""
}

// checkDecimal returns what is wrong with d, or "" when it is a finite,
// non-negative decimal within MaxIntegerDigits and MaxFractionDigits.
func checkDecimal(d *apd.Decimal) string {
	if problem := checkMagnitude(d); problem != "" {
		return problem
	}
	if d.Sign() < 0 {
		return fmt.Sprintf("must not be negative; got %s", Text(d))
	}
	return ""
}

// checkMagnitude returns what is wrong with d, or "" when it is finite and
// its absolute value is within MaxIntegerDigits and MaxFractionDigits (so
// Text(d) is short).
func checkMagnitude(d *apd.Decimal) string {
	if d.Form != apd.Finite {
		return "must be a finite decimal"
	}
	if d.NumDigits() > maxDigits {
		return fmt.Sprintf("has %d digits; send at most %d", d.NumDigits(), maxDigits)
	}
	r := reduced(d)
	if r.IsZero() {
		return ""
	}
	if frac := -int64(r.Exponent); frac > MaxFractionDigits {
		return fmt.Sprintf("has %d digits after the point; send at most %d", frac, MaxFractionDigits)
	}
	if whole := r.NumDigits() + int64(r.Exponent); whole > MaxIntegerDigits {
		return fmt.Sprintf("has %d digits before the point; send at most %d", whole, MaxIntegerDigits)
	}
	return ""
}

// reduced returns d without trailing zeros, so equal values have one
// representation; zero is 0, never -0.
func reduced(d *apd.Decimal) apd.Decimal {
	var r apd.Decimal
	r.Reduce(d)
	if r.IsZero() {
		return apd.Decimal{}
	}
	return r
}

// Text is d in plain notation without trailing zeros ("1000", never
// "1E+3"): the one spelling of a decimal that the canonical encoding and
// messages use.
func Text(d *apd.Decimal) string {
	r := reduced(d)
	return r.Text('f')
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const limit = 40
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
