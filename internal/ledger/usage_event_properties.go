package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// UsageEventPropertiesMaxBytes is the largest a usage event's properties may
// be as stored: the compact JSON object with every number as Postgres keeps
// it (jsonb writes a number's exponent out, so 1e300 takes 301 bytes).
const UsageEventPropertiesMaxBytes = 16 << 10

// Bounds on one number of a usage event's properties: what a float64 holds.
const (
	// propertyDigitsMax is the most significant digits a number may have:
	// 17 tell every float64 apart.
	propertyDigitsMax = 17

	// propertyExponentMax bounds the exponent as written: any float64 is
	// written with a smaller one (5e-324 … 1.7976931348623157e308).
	propertyExponentMax = 400

	// propertyScaleMax bounds the digits after the decimal point as Postgres
	// keeps them: the smallest float64 written with 17 digits,
	// 4.9406564584124654e-324, has 340.
	propertyScaleMax = 340
)

// UsageEventProperties returns the canonical form of a usage event's
// properties, the form the ledger hashes and stores: the JSON object with its
// keys sorted and its numbers as written. Absent or null properties are {}.
//
// It returns a *ValidationError when raw is not a JSON object, holds the NUL
// character (jsonb cannot store it), holds a number a float64 cannot hold
// (beyond ±1.7976931348623157e308, a non-zero number that rounds to zero,
// more than 17 significant digits, an exponent beyond ±400, more than 340
// digits after the decimal point), or is larger than
// UsageEventPropertiesMaxBytes as stored. The field is "properties", or the
// path of the first bad number in key order, such as "properties.x" or
// "properties.sizes[2]".
func UsageEventProperties(raw json.RawMessage) ([]byte, error) {
	invalid := func(field, format string, args ...any) error {
		return &ValidationError{Fields: map[string]string{field: fmt.Sprintf(format, args...)}}
	}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return []byte("{}"), nil
	}
	var obj map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return nil, invalid("properties", "must be a JSON object")
	}
	w := propertiesWalk{}
	w.walk(obj)
	if w.nul {
		return nil, invalid("properties", "must not contain the NUL character (\\u0000) in keys or strings")
	}
	if w.badField != "" {
		return nil, invalid(w.badField, "%s", w.badMessage)
	}
	canonical, err := json.Marshal(obj) // sorted keys, numbers as written
	if err != nil {
		return nil, invalid("properties", "must be a JSON object")
	}
	if size := len(canonical) + w.growth; size > UsageEventPropertiesMaxBytes {
		return nil, invalid("properties", "are %d bytes as stored (numbers written out in full); send at most %d bytes (16 KiB)",
			size, UsageEventPropertiesMaxBytes)
	}
	return canonical, nil
}

// propertiesWalk checks a decoded properties object: NUL characters, the
// first number out of bounds (in key order), and by how many bytes the
// numbers grow when Postgres writes them out. It keeps the path to the value
// it walks as a stack of steps, and writes it out only for a bad number: a
// path written at every level would cost the square of the depth (5,000
// levels of 32-byte keys, 412 MB).
type propertiesWalk struct {
	path       []propertyStep
	nul        bool
	badField   string
	badMessage string
	growth     int
}

// propertyStep is one step of a path into properties: a key, or an index
// into an array when key is empty and index not negative.
type propertyStep struct {
	key   string
	index int
}

func (w *propertiesWalk) walk(v any) {
	if w.nul || w.badField != "" {
		return
	}
	switch v := v.(type) {
	case string:
		w.nul = strings.ContainsRune(v, 0)
	case json.Number:
		stored, msg := propertyNumber(string(v))
		if msg != "" {
			w.badField, w.badMessage = w.pathString(), msg
			return
		}
		w.growth += stored - len(v)
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			if strings.ContainsRune(k, 0) {
				w.nul = true
				return
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			w.path = append(w.path, propertyStep{key: k, index: -1})
			w.walk(v[k])
			w.path = w.path[:len(w.path)-1]
		}
	case []any:
		for i, e := range v {
			w.path = append(w.path, propertyStep{index: i})
			w.walk(e)
			w.path = w.path[:len(w.path)-1]
		}
	}
}

// pathString writes out the path walked: properties, then .key, ["key"] or
// [index] per step.
func (w *propertiesWalk) pathString() string {
	var sb strings.Builder
	sb.WriteString("properties")
	for _, step := range w.path {
		if step.index >= 0 {
			sb.WriteString("[" + strconv.Itoa(step.index) + "]")
		} else {
			sb.WriteString(propertyStepKey(step.key))
		}
	}
	return sb.String()
}

var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// propertyStepKey names a step to key: .key, or ["key"] when the key is not
// a plain name. Keys are cut at 64 bytes.
func propertyStepKey(key string) string {
	if plainKey.MatchString(key) && len(key) <= 64 {
		return "." + key
	}
	if len(key) > 64 {
		key = strings.ToValidUTF8(key[:64], "") + "…"
	}
	quoted, _ := json.Marshal(key)
	return "[" + string(quoted) + "]"
}

// propertyNumber checks the JSON number s against what a float64 holds and
// returns how many bytes Postgres's jsonb writes it with, or a message saying
// what to send instead.
func propertyNumber(s string) (stored int, msg string) {
	n, ok := splitNumber(s)
	if !ok {
		return 0, "must be a JSON number"
	}
	shown := s
	if len(shown) > 32 {
		shown = shown[:32] + "…"
	}
	if n.exp > propertyExponentMax || n.exp < -propertyExponentMax {
		return 0, fmt.Sprintf("is %s, with an exponent beyond ±%d; send a number a float64 holds, or a string", shown, propertyExponentMax)
	}
	digits := strings.Trim(n.intDigits+n.fracDigits, "0")
	if len(digits) > propertyDigitsMax {
		return 0, fmt.Sprintf("is %s, with %d significant digits; a float64 holds %d: round it, or send it as a string",
			shown, len(digits), propertyDigitsMax)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, fmt.Sprintf("is %s, outside what a float64 holds (±1.7976931348623157e308); send a smaller number, or a string", shown)
	}
	if f == 0 && digits != "" {
		return 0, fmt.Sprintf("is %s, too small for a float64 (it would be 0; the smallest is 5e-324); send 0, or a string", shown)
	}
	scale := max(0, len(n.fracDigits)-n.exp)
	if scale > propertyScaleMax {
		return 0, fmt.Sprintf("is %s, with %d digits after the decimal point; send at most %d (drop trailing zeros)",
			shown, scale, propertyScaleMax)
	}
	return n.storedLen(), ""
}

// jsonNumber is a JSON number split into its parts.
type jsonNumber struct {
	neg        bool
	intDigits  string
	fracDigits string
	exp        int // saturated beyond ±99999
}

// splitNumber splits a JSON number (-?int(.frac)?([eE][+-]?exp)?).
func splitNumber(s string) (jsonNumber, bool) {
	var n jsonNumber
	if strings.HasPrefix(s, "-") {
		n.neg, s = true, s[1:]
	}
	mantissa, exp, hasExp := strings.Cut(strings.ReplaceAll(s, "E", "e"), "e")
	n.intDigits, n.fracDigits, _ = strings.Cut(mantissa, ".")
	if n.intDigits == "" || !isDigits(n.intDigits) || !isDigits(n.fracDigits) {
		return n, false
	}
	if hasExp {
		expNeg := strings.HasPrefix(exp, "-")
		exp = strings.TrimLeft(exp, "+-")
		if exp == "" || !isDigits(exp) {
			return n, false
		}
		exp = strings.TrimLeft(exp, "0")
		if len(exp) > 5 {
			exp = "99999"
		}
		n.exp, _ = strconv.Atoi("0" + exp)
		if expNeg {
			n.exp = -n.exp
		}
	}
	return n, true
}

func isDigits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// storedLen is the length of the number as Postgres's numeric writes it:
// the exponent applied, no leading zeros, the scale as written (digits after
// the point, plus those a negative exponent adds), a sign only when not zero.
// For 1e3 "1000", 1.50 "1.50", 1.5e-3 "0.0015", -0 "0".
func (n jsonNumber) storedLen() int {
	digits := n.intDigits + n.fracDigits
	point := len(n.intDigits) + n.exp // digits before the decimal point
	lead := len(digits) - len(strings.TrimLeft(digits, "0"))
	length := 1 // the integer part: "0" unless there are digits before the point
	if lead < len(digits) && lead < point {
		length = point - lead
	}
	if scale := len(n.fracDigits) - n.exp; scale > 0 {
		length += 1 + scale
	}
	if n.neg && lead < len(digits) {
		length++
	}
	return length
}
