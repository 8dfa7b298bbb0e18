package pricing

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cockroachdb/apd/v3"
)

// priceFields are the fields any price may take; a key outside them is
// unknown whatever the model.
var priceFields = []string{"model", "package_size", "unit_amount", "tiers", "minimum_amount"}

// tierFields are the fields of a tier.
var tierFields = []string{"up_to", "unit_amount", "flat_amount"}

// ParsePlan decodes data, a plan as a client sends it:
//
//	{"currency":"usd","prices":{"api_calls":{"model":"per_unit","unit_amount":"0.025"}}}
//
// Decoding is strict: field names match exactly, each at most once;
// unknown fields, fields the price's model does not use and decimals sent
// as JSON numbers are refused; null is the same as an absent field (for
// up_to, an open-ended tier). The currency may be sent in any case and is
// kept in lower case; decimals are kept without trailing zeros. ParsePlan
// returns a *ValidationError naming every bad field by its path, or an
// error wrapping ErrMalformedPlan when data is not one JSON object.
func ParsePlan(data []byte) (Plan, error) {
	if !json.Valid(data) {
		return Plan{}, fmt.Errorf("%w: the body is not valid JSON", ErrMalformedPlan)
	}
	top, ok := members(data)
	if !ok {
		return Plan{}, ErrMalformedPlan
	}
	d := decoder{fe: fieldErrors{}}
	var p Plan
	d.keys("", top, []string{"currency", "prices"}, "a plan takes currency and prices")
	switch raw, ok := present(top, "currency"); {
	case !ok:
		d.fe.add("currency", `is required; send a three-letter ISO 4217 code, such as "usd"`)
	default:
		if s, ok := d.str("currency", raw, `"usd"`); ok {
			p.Currency = strings.ToLower(s)
		}
	}
	if raw, ok := present(top, "prices"); !ok {
		d.fe.add("prices", `is required; send an object of prices by metric, such as {"api_calls":{"model":"per_unit","unit_amount":"0.025"}}, or {} for none`)
	} else {
		p.Prices = d.prices(raw)
	}
	if err := d.fe.err(); err != nil {
		return Plan{}, err
	}
	if err := p.Validate(); err != nil {
		return Plan{}, err
	}
	return p, nil
}

// decoder turns the JSON of a plan into a Plan, collecting a message per
// bad field; a bad field is left zero.
type decoder struct {
	fe fieldErrors
}

// member is one key and raw value of a JSON object.
type member struct {
	key   string
	value json.RawMessage
}

// object is a JSON object's members in order; a key may repeat.
type object []member

// members returns raw's members, or false when raw, valid JSON, is not an
// object.
func members(raw json.RawMessage) (object, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var obj object
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		key, _ := tok.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, false
		}
		obj = append(obj, member{key, value})
	}
	return obj, true
}

// present returns the value of key in obj unless it is absent or null.
func present(obj object, key string) (json.RawMessage, bool) {
	for _, m := range obj {
		if m.key == key {
			return m.value, !isNull(m.value)
		}
	}
	return nil, false
}

func isNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// keys adds a message for each key of obj, at path, that appears twice or
// is not in allowed; for an unknown key, hint says what the object takes.
func (d *decoder) keys(path string, obj object, allowed []string, hint string) {
	seen := make(map[string]bool, len(obj))
	for _, m := range obj {
		at := join(path, m.key)
		switch {
		case seen[m.key]:
			d.fe.add(at, "appears more than once; send each field once")
		case !contains(allowed, m.key):
			d.fe.add(at, "is not a known field; %s", hint)
		}
		seen[m.key] = true
	}
}

// prices decodes the object of prices by metric.
func (d *decoder) prices(raw json.RawMessage) map[string]Price {
	obj, ok := members(raw)
	if !ok {
		d.fe.add("prices", `must be an object of prices by metric, such as {"api_calls":{"model":"per_unit","unit_amount":"0.025"}}`)
		return nil
	}
	seen := make(map[string]bool, len(obj))
	prices := make(map[string]Price, len(obj))
	for _, m := range obj {
		path := "prices." + m.key
		if seen[m.key] {
			d.fe.add(path, "appears more than once; send each metric once")
			continue
		}
		seen[m.key] = true
		prices[m.key] = d.price(path, m.value)
	}
	return prices
}

// price decodes one metric's price at path.
func (d *decoder) price(path string, raw json.RawMessage) Price {
	var p Price
	obj, ok := members(raw)
	if !ok {
		d.fe.add(path, `must be an object such as {"model":"per_unit","unit_amount":"0.025"}`)
		return p
	}
	rawModel, ok := present(obj, "model")
	if !ok {
		d.fe.add(path+".model", "is required; send one of %s", modelList())
	} else if s, ok := d.str(path+".model", rawModel, `"per_unit"`); ok {
		p.Model = Model(s)
		if _, known := modelFields[p.Model]; !known {
			d.fe.add(path+".model", "must be one of %s; got %q", modelList(), truncate(s))
		}
	}
	fields, known := modelFields[p.Model]
	hint := "a price takes " + strings.Join(priceFields, ", ")
	if known {
		hint = takes(p.Model)
	}
	d.keys(path, obj, priceFields, hint)
	if !known {
		return p
	}
	for _, m := range obj {
		if contains(priceFields, m.key) && !contains(fields, m.key) && !isNull(m.value) {
			d.fe.add(join(path, m.key), "is not used by the %s model; %s", p.Model, takes(p.Model))
		}
	}
	examples := map[string]string{"unit_amount": "0.025", "package_size": "100", "minimum_amount": "500"}
	for _, field := range fields {
		raw, ok := present(obj, field)
		at := join(path, field)
		switch {
		case field == "model":
		case !ok && field == "minimum_amount":
		case !ok:
			d.fe.add(at, "is required for the %s model; %s", p.Model, takes(p.Model))
		case field == "unit_amount":
			p.UnitAmount = d.decimal(at, raw, examples[field])
		case field == "package_size":
			p.PackageSize = d.decimal(at, raw, examples[field])
		case field == "minimum_amount":
			p.MinimumAmount = d.decimal(at, raw, examples[field])
		case field == "tiers":
			p.Tiers = d.tiers(at, raw)
		}
	}
	return p
}

// tiers decodes the tiers of a graduated or volume price at path.
func (d *decoder) tiers(path string, raw json.RawMessage) []Tier {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		d.fe.add(path, `must be an array of tiers, such as [{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1"}]`)
		return nil
	}
	if len(list) > MaxTiers {
		d.fe.add(path, "has %d tiers; send at most %d", len(list), MaxTiers)
		return nil
	}
	tiers := make([]Tier, len(list))
	for i, rawTier := range list {
		at := fmt.Sprintf("%s[%d]", path, i)
		obj, ok := members(rawTier)
		if !ok {
			d.fe.add(at, `must be an object such as {"up_to":"1000","unit_amount":"0.5","flat_amount":"0"}`)
			continue
		}
		d.keys(at, obj, tierFields, "a tier takes "+strings.Join(tierFields, ", "))
		if raw, ok := present(obj, "up_to"); ok {
			upTo := d.decimal(at+".up_to", raw, "1000")
			tiers[i].UpTo = &upTo
		}
		if raw, ok := present(obj, "unit_amount"); ok {
			tiers[i].UnitAmount = d.decimal(at+".unit_amount", raw, "0.5")
		} else {
			d.fe.add(at+".unit_amount", `is required; send the amount per unit in this tier, such as "0.5" ("0" for none)`)
		}
		if raw, ok := present(obj, "flat_amount"); ok {
			tiers[i].FlatAmount = d.decimal(at+".flat_amount", raw, "100")
		}
	}
	return tiers
}

// str decodes a JSON string at path; example is a JSON value to send.
func (d *decoder) str(path string, raw json.RawMessage, example string) (string, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		d.fe.add(path, "must be a string such as %s", example)
		return "", false
	}
	return s, true
}

// decimal decodes a decimal string at path; example is a decimal to send.
func (d *decoder) decimal(path string, raw json.RawMessage, example string) apd.Decimal {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		if n := bytes.TrimSpace(raw); decimalSyntax.Match(n) {
			example = truncate(string(n))
		}
		d.fe.add(path, "must be a decimal in a string, such as %q", example)
		return apd.Decimal{}
	}
	v, problem := parseDecimal(s, example)
	if problem != "" {
		d.fe.add(path, "%s", problem)
	}
	return v
}

// join is path.key, or key at the top.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
