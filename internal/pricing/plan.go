package pricing

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/apd/v3"
)

// Model is how a price turns a quantity into an amount.
type Model string

// The price models.
const (
	// ModelPerUnit prices quantity × UnitAmount.
	ModelPerUnit Model = "per_unit"
	// ModelGraduated prices each unit in the tier it falls in, plus the flat
	// amount of every tier the quantity reaches.
	ModelGraduated Model = "graduated"
	// ModelVolume prices the whole quantity at the unit amount of the tier it
	// reaches, plus that tier's flat amount.
	ModelVolume Model = "volume"
	// ModelPackage prices UnitAmount per started package of PackageSize
	// units.
	ModelPackage Model = "package"
)

// metricMaxBytes is the longest metric name, as for every id Tally stores.
const metricMaxBytes = 255

// Plan is one version of a price book: a currency and a price per metric.
// ParsePlan builds one from JSON; one built by hand should pass Validate.
// A Plan is a value: nothing in this package modifies one.
type Plan struct {
	// Currency is a three-letter ISO 4217 code in lower case, such as "usd".
	// Every amount in the plan is in its minor unit.
	Currency string
	// Prices maps a metric name (1 to 255 bytes of UTF-8 without control
	// characters, as for every id) to its price. A metric without a price
	// cannot be rated; an empty plan prices nothing.
	Prices map[string]Price
}

// Price is one metric's price. Which fields are used depends on Model; the
// others must be zero.
type Price struct {
	Model Model
	// UnitAmount is the amount per unit (per_unit) or per started package
	// (package), in minor units; it may have a fraction, such as 0.025.
	UnitAmount apd.Decimal
	// PackageSize is the number of units in a package (package only); above
	// zero.
	PackageSize apd.Decimal
	// Tiers are the tiers of a graduated or volume price, by ascending
	// UpTo; only the last is open-ended.
	Tiers []Tier
	// MinimumAmount, when above zero, is the least the line comes to in a
	// period with usage (a quantity above zero); zero means no minimum.
	MinimumAmount apd.Decimal
}

// Tier is one tier of a graduated or volume price. It covers the quantities
// above the previous tier's UpTo (zero for the first) up to its own UpTo,
// inclusive.
type Tier struct {
	// UpTo is the tier's inclusive upper bound; nil for the last tier, which
	// is open-ended (JSON null).
	UpTo *apd.Decimal
	// UnitAmount is the amount per unit priced in this tier, in minor units.
	UnitAmount apd.Decimal
	// FlatAmount is added once when the quantity reaches this tier; zero for
	// none.
	FlatAmount apd.Decimal
}

// modelFields are the JSON fields each model takes, in canonical order.
var modelFields = map[Model][]string{
	ModelPerUnit:   {"model", "unit_amount", "minimum_amount"},
	ModelGraduated: {"model", "tiers", "minimum_amount"},
	ModelVolume:    {"model", "tiers", "minimum_amount"},
	ModelPackage:   {"model", "package_size", "unit_amount", "minimum_amount"},
}

// models lists the models in the order messages name them.
var models = []Model{ModelPerUnit, ModelGraduated, ModelVolume, ModelPackage}

// Validate returns a *ValidationError naming every field of p that breaks a
// rule, or nil. ParsePlan's plans always pass.
func (p Plan) Validate() error {
	fe := fieldErrors{}
	p.validate(fe)
	return fe.err()
}

func (p Plan) validate(fe fieldErrors) {
	if len(p.Currency) != 3 || strings.Trim(p.Currency, "abcdefghijklmnopqrstuvwxyz") != "" {
		fe.add("currency", "must be a three-letter ISO 4217 code, such as \"usd\"; got %q", truncate(p.Currency))
	}
	for metric, price := range p.Prices {
		path := "prices." + metric
		if problem := checkMetric(metric); problem != "" {
			fe.add(path, "%s", problem)
			continue
		}
		price.validate(fe, path)
	}
}

// checkMetric returns what is wrong with a metric name, or "".
func checkMetric(m string) string {
	switch {
	case m == "":
		return "a metric name must not be empty; send a name such as \"api_calls\""
	case len(m) > metricMaxBytes:
		return fmt.Sprintf("a metric name is at most %d bytes; this one is %d", metricMaxBytes, len(m))
	case !utf8.ValidString(m):
		return "a metric name must be valid UTF-8"
	case strings.IndexFunc(m, unicode.IsControl) >= 0:
		return "a metric name must not contain control characters"
	}
	return ""
}

// validate adds a message to fe, under path, for each rule the price breaks.
func (p Price) validate(fe fieldErrors, path string) {
	fields, ok := modelFields[p.Model]
	if !ok {
		fe.add(path+".model", "must be one of %s; got %q", modelList(), truncate(string(p.Model)))
		return
	}
	unused := func(field string, zero bool) {
		if !zero && !contains(fields, field) {
			fe.add(path+"."+field, "is not used by the %s model; %s", p.Model, takes(p.Model))
		}
	}
	unused("unit_amount", p.UnitAmount.IsZero())
	unused("package_size", p.PackageSize.IsZero())
	unused("tiers", len(p.Tiers) == 0)
	checkAmount(fe, path+".unit_amount", &p.UnitAmount)
	checkAmount(fe, path+".minimum_amount", &p.MinimumAmount)
	checkAmount(fe, path+".package_size", &p.PackageSize)
	switch p.Model {
	case ModelPackage:
		if p.PackageSize.Sign() == 0 {
			fe.add(path+".package_size", "must be greater than 0; send the number of units in a package, such as \"100\"")
		}
	case ModelGraduated, ModelVolume:
		validateTiers(fe, path+".tiers", p.Tiers)
	}
}

// validateTiers adds a message to fe for each rule tiers break: one to
// MaxTiers tiers, bounds above zero and ascending, only the last open-ended.
func validateTiers(fe fieldErrors, path string, tiers []Tier) {
	switch {
	case len(tiers) == 0:
		fe.add(path, `must have at least one tier; send [{"up_to":null,"unit_amount":"0.5"}] for a single one`)
		return
	case len(tiers) > MaxTiers:
		fe.add(path, "has %d tiers; send at most %d", len(tiers), MaxTiers)
		return
	}
	var prev *apd.Decimal
	for i, t := range tiers {
		at := fmt.Sprintf("%s[%d]", path, i)
		checkAmount(fe, at+".unit_amount", &t.UnitAmount)
		checkAmount(fe, at+".flat_amount", &t.FlatAmount)
		last := i == len(tiers)-1
		switch {
		case t.UpTo == nil && !last:
			fe.add(at+".up_to", "only the last tier may be open-ended (null); send this tier's inclusive upper bound, such as \"1000\"")
		case t.UpTo != nil && last:
			fe.add(at+".up_to", "the last tier must be open-ended; send null (or add an open-ended tier after it)")
		case t.UpTo == nil:
		case checkDecimal(t.UpTo) != "":
			fe.add(at+".up_to", "%s", checkDecimal(t.UpTo))
		case prev == nil && t.UpTo.Sign() == 0:
			fe.add(at+".up_to", "must be greater than 0; the first tier starts above 0")
		case prev != nil && t.UpTo.Cmp(prev) <= 0:
			fe.add(at+".up_to", "must be greater than the previous tier's up_to (%s)", Text(prev))
		}
		if t.UpTo != nil && checkDecimal(t.UpTo) == "" {
			prev = t.UpTo
		}
	}
}

// checkAmount adds a message to fe when d is not a finite, non-negative
// decimal within the limits.
func checkAmount(fe fieldErrors, path string, d *apd.Decimal) {
	if problem := checkDecimal(d); problem != "" {
		fe.add(path, "%s", problem)
	}
}

// modelList names the models for a message.
func modelList() string {
	names := make([]string, len(models))
	for i, m := range models {
		names[i] = string(m)
	}
	return strings.Join(names, ", ")
}

// takes says which fields a price of model m takes, for a message.
func takes(m Model) string {
	return fmt.Sprintf("a %s price takes %s", m, strings.Join(modelFields[m], ", "))
}

// MarshalJSON returns p's canonical encoding: compact JSON with the metrics
// in byte order, each price's fields in a fixed order, decimals as strings
// in plain notation without trailing zeros ("0.5", "1000"), and zero
// minimum and flat amounts left out. Plans with the same content encode to
// the same bytes, so a version's content can be hashed, and a PUT of the
// same content (however it was spelled) recognised as a replay. Store the
// bytes themselves (text or bytea), not as jsonb, which reorders keys.
// MarshalJSON returns p.Validate's error for an invalid plan.
func (p Plan) MarshalJSON() ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	w := planJSON{Currency: p.Currency, Prices: make(map[string]priceJSON, len(p.Prices))}
	for metric, price := range p.Prices {
		w.Prices[metric] = price.wire()
	}
	return json.Marshal(w)
}

// UnmarshalJSON sets p from data as ParsePlan does.
func (p *Plan) UnmarshalJSON(data []byte) error {
	plan, err := ParsePlan(data)
	if err != nil {
		return err
	}
	*p = plan
	return nil
}

// planJSON, priceJSON and tierJSON are the canonical encoding; their field
// order is the order of the keys.
type planJSON struct {
	Currency string               `json:"currency"`
	Prices   map[string]priceJSON `json:"prices"`
}

type priceJSON struct {
	Model         Model      `json:"model"`
	PackageSize   string     `json:"package_size,omitempty"`
	UnitAmount    string     `json:"unit_amount,omitempty"`
	Tiers         []tierJSON `json:"tiers,omitempty"`
	MinimumAmount string     `json:"minimum_amount,omitempty"`
}

type tierJSON struct {
	UpTo       *string `json:"up_to"`
	UnitAmount string  `json:"unit_amount"`
	FlatAmount string  `json:"flat_amount,omitempty"`
}

func (p Price) wire() priceJSON {
	w := priceJSON{Model: p.Model}
	switch p.Model {
	case ModelPerUnit:
		w.UnitAmount = Text(&p.UnitAmount)
	case ModelPackage:
		w.PackageSize = Text(&p.PackageSize)
		w.UnitAmount = Text(&p.UnitAmount)
	case ModelGraduated, ModelVolume:
		w.Tiers = make([]tierJSON, len(p.Tiers))
		for i, t := range p.Tiers {
			w.Tiers[i] = tierJSON{UnitAmount: Text(&t.UnitAmount), FlatAmount: nonZero(&t.FlatAmount)}
			if t.UpTo != nil {
				upTo := Text(t.UpTo)
				w.Tiers[i].UpTo = &upTo
			}
		}
	}
	w.MinimumAmount = nonZero(&p.MinimumAmount)
	return w
}

// nonZero is d's text, or "" (left out) for zero.
func nonZero(d *apd.Decimal) string {
	if d.IsZero() {
		return ""
	}
	return Text(d)
}
