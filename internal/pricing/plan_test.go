package pricing_test

import (
	"strings"
	"testing"

	"github.com/cockroachdb/apd/v3"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/pricing"
)

// gradTiers is a valid graduated price body, for tests that vary the rest.
const gradTiers = `"tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1"}]`

// planWith is a plan body whose one price, for metric "m", is price.
func planWith(price string) string {
	return `{"currency":"usd","prices":{"m":` + price + `}}`
}

// requireFields requires err to be a *pricing.ValidationError with exactly
// fields.
func requireFields(t *testing.T, err error, fields map[string]string) {
	t.Helper()
	var ve *pricing.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, fields, ve.Fields)
}

func TestParsePlan(t *testing.T) {
	t.Parallel()

	t.Run("Canonical", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name, in, want string
		}{
			{"Empty", `{"prices":{},"currency":"usd"}`, `{"currency":"usd","prices":{}}`},
			{"Graduated",
				`{"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.50"},{"up_to":null,"unit_amount":"0.1","flat_amount":"0"}]}}}`,
				`{"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1"}]}}}`},
			{"MetricsSorted",
				`{"currency":"usd","prices":{"b":{"model":"per_unit","unit_amount":"1"},"a":{"model":"per_unit","unit_amount":"2"}}}`,
				`{"currency":"usd","prices":{"a":{"model":"per_unit","unit_amount":"2"},"b":{"model":"per_unit","unit_amount":"1"}}}`},
			{"MinimumZeroLeftOut", planWith(`{"model":"per_unit","unit_amount":"1","minimum_amount":"0.000"}`),
				planWith(`{"model":"per_unit","unit_amount":"1"}`)},
			{"NullIsAbsent", planWith(`{"model":"per_unit","unit_amount":"1","minimum_amount":null,"tiers":null}`),
				planWith(`{"model":"per_unit","unit_amount":"1"}`)},
			{"Package", planWith(`{"unit_amount":"250","package_size":"100.0","model":"package","minimum_amount":"500"}`),
				planWith(`{"model":"package","package_size":"100","unit_amount":"250","minimum_amount":"500"}`)},
			{"PerUnit", `{"currency":"USD","prices":{"api_calls":{"model":"per_unit","unit_amount":"0.0250"}}}`,
				`{"currency":"usd","prices":{"api_calls":{"model":"per_unit","unit_amount":"0.025"}}}`},
			{"PlainNotation", planWith(`{"model":"volume","tiers":[{"up_to":"1e3","unit_amount":"1E-12"},{"up_to":"10000000000000000000","unit_amount":"0"},{"unit_amount":"0.000000000001","flat_amount":"99999999999999999999.999999999999"}]}`),
				planWith(`{"model":"volume","tiers":[{"up_to":"1000","unit_amount":"0.000000000001"},{"up_to":"10000000000000000000","unit_amount":"0"},{"up_to":null,"unit_amount":"0.000000000001","flat_amount":"99999999999999999999.999999999999"}]}`)},
			{"Whitespace", " {\n\"currency\" : \"usd\" ,\t\"prices\":{ } }\n", `{"currency":"usd","prices":{}}`},
		}
		for _, tt := range tests {
			p, err := pricing.ParsePlan([]byte(tt.in))
			require.NoError(t, err, tt.name)
			got, err := p.MarshalJSON()
			require.NoError(t, err, tt.name)
			require.Equal(t, tt.want, string(got), tt.name)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		tiers := make([]string, pricing.MaxTiers+1)
		for i := range tiers {
			tiers[i] = `{"unit_amount":"1"}`
		}
		tests := []struct {
			name, in string
			want     map[string]string
		}{
			{"CurrencyCase", `{"Currency":"usd","prices":{}}`, map[string]string{
				"Currency": "is not a known field; a plan takes currency and prices",
				"currency": `is required; send a three-letter ISO 4217 code, such as "usd"`}},
			{"CurrencyLength", `{"currency":"usdx","prices":{}}`, map[string]string{
				"currency": `must be a three-letter ISO 4217 code, such as "usd"; got "usdx"`}},
			{"CurrencyNumber", `{"currency":840,"prices":{}}`, map[string]string{
				"currency": `must be a string such as "usd"`}},
			{"DecimalAsNumber", planWith(`{"model":"per_unit","unit_amount":0.025}`), map[string]string{
				"prices.m.unit_amount": `must be a decimal in a string, such as "0.025"`}},
			{"DecimalFraction", planWith(`{"model":"per_unit","unit_amount":"0.0000000000001"}`), map[string]string{
				"prices.m.unit_amount": "has 13 digits after the point; send at most 12"}},
			{"DecimalInteger", planWith(`{"model":"per_unit","unit_amount":"100000000000000000000"}`), map[string]string{
				"prices.m.unit_amount": "has 21 digits before the point; send at most 20"}},
			{"DecimalLong", planWith(`{"model":"per_unit","unit_amount":"1.` + strings.Repeat("0", 99) + `"}`), map[string]string{
				"prices.m.unit_amount": `is 101 characters long; send at most 100, such as "0.025"`}},
			{"DecimalNegative", planWith(`{"model":"per_unit","unit_amount":"1","minimum_amount":"-5"}`), map[string]string{
				"prices.m.minimum_amount": "must not be negative; got -5"}},
			{"DecimalSyntax", planWith(`{"model":"per_unit","unit_amount":"1,5"}`), map[string]string{
				"prices.m.unit_amount": `must be a decimal such as "0.025"; got "1,5"`}},
			{"DuplicateField", `{"currency":"usd","currency":"eur","prices":{}}`, map[string]string{
				"currency": "appears more than once; send each field once"}},
			{"DuplicateMetric", `{"currency":"usd","prices":{"m":{"model":"per_unit","unit_amount":"1"},"m":{"model":"per_unit","unit_amount":"2"}}}`, map[string]string{
				"prices.m": "appears more than once; send each metric once"}},
			{"FieldOfOtherModel", planWith(`{"model":"per_unit","unit_amount":"1",` + gradTiers + `}`), map[string]string{
				"prices.m.tiers": "is not used by the per_unit model; a per_unit price takes model, unit_amount, minimum_amount"}},
			{"MetricControl", `{"currency":"usd","prices":{"a\nb":{"model":"per_unit","unit_amount":"1"}}}`, map[string]string{
				"prices.a\nb": "a metric name must not contain control characters"}},
			{"MetricEmpty", `{"currency":"usd","prices":{"":{"model":"per_unit","unit_amount":"1"}}}`, map[string]string{
				"prices.": `a metric name must not be empty; send a name such as "api_calls"`}},
			{"MetricLong", `{"currency":"usd","prices":{"` + strings.Repeat("m", 256) + `":{"model":"per_unit","unit_amount":"1"}}}`, map[string]string{
				"prices." + strings.Repeat("m", 256): "a metric name is at most 255 bytes; this one is 256"}},
			{"Missing", `{}`, map[string]string{
				"currency": `is required; send a three-letter ISO 4217 code, such as "usd"`,
				"prices":   `is required; send an object of prices by metric, such as {"api_calls":{"model":"per_unit","unit_amount":"0.025"}}, or {} for none`}},
			{"ModelMissing", planWith(`{"unit_amount":"1"}`), map[string]string{
				"prices.m.model": "is required; send one of per_unit, graduated, volume, package"}},
			{"ModelUnknown", planWith(`{"model":"tiered","unit_amount":"1"}`), map[string]string{
				"prices.m.model": `must be one of per_unit, graduated, volume, package; got "tiered"`}},
			{"PackageAmount", planWith(`{"model":"package","package_size":"100","package_amount":"250"}`), map[string]string{
				"prices.m.package_amount": "is not a known field; a package price takes model, package_size, unit_amount, minimum_amount",
				"prices.m.unit_amount":    "is required for the package model; a package price takes model, package_size, unit_amount, minimum_amount"}},
			{"PackageSizeZero", planWith(`{"model":"package","package_size":"0.0","unit_amount":"250"}`), map[string]string{
				"prices.m.package_size": `must be greater than 0; send the number of units in a package, such as "100"`}},
			{"PriceNotObject", planWith(`"0.025"`), map[string]string{
				"prices.m": `must be an object such as {"model":"per_unit","unit_amount":"0.025"}`}},
			{"PricesNotObject", `{"currency":"usd","prices":[]}`, map[string]string{
				"prices": `must be an object of prices by metric, such as {"api_calls":{"model":"per_unit","unit_amount":"0.025"}}`}},
			{"TierFieldUnknown", planWith(`{"model":"volume","tiers":[{"up_to":null,"unit_amount":"1","flat":"1"}]}`), map[string]string{
				"prices.m.tiers[0].flat": "is not a known field; a tier takes up_to, unit_amount, flat_amount"}},
			{"TierFirstZero", planWith(`{"model":"graduated","tiers":[{"up_to":"0","unit_amount":"1"},{"up_to":null,"unit_amount":"1"}]}`), map[string]string{
				"prices.m.tiers[0].up_to": "must be greater than 0; the first tier starts above 0"}},
			{"TierLastBounded", planWith(`{"model":"graduated","tiers":[{"up_to":"10","unit_amount":"1"}]}`), map[string]string{
				"prices.m.tiers[0].up_to": "the last tier must be open-ended; send null (or add an open-ended tier after it)"}},
			{"TierNotAscending", planWith(`{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":"999.999","unit_amount":"0.2"},{"up_to":"999.9990","unit_amount":"0.2"},{"up_to":null,"unit_amount":"0.1"}]}`), map[string]string{
				"prices.m.tiers[1].up_to": "must be greater than the previous tier's up_to (1000)",
				"prices.m.tiers[2].up_to": "must be greater than the previous tier's up_to (999.999)"}},
			{"TierNotObject", planWith(`{"model":"graduated","tiers":["1000"]}`), map[string]string{
				"prices.m.tiers[0]": `must be an object such as {"up_to":"1000","unit_amount":"0.5","flat_amount":"0"}`}},
			{"TierOpenInMiddle", planWith(`{"model":"graduated","tiers":[{"unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1"}]}`), map[string]string{
				"prices.m.tiers[0].up_to": `only the last tier may be open-ended (null); send this tier's inclusive upper bound, such as "1000"`}},
			{"TierUnitAmountMissing", planWith(`{"model":"graduated","tiers":[{"up_to":null,"flat_amount":"100"}]}`), map[string]string{
				"prices.m.tiers[0].unit_amount": `is required; send the amount per unit in this tier, such as "0.5" ("0" for none)`}},
			{"TiersEmpty", planWith(`{"model":"volume","tiers":[]}`), map[string]string{
				"prices.m.tiers": `must have at least one tier; send [{"up_to":null,"unit_amount":"0.5"}] for a single one`}},
			{"TiersMissing", planWith(`{"model":"graduated"}`), map[string]string{
				"prices.m.tiers": "is required for the graduated model; a graduated price takes model, tiers, minimum_amount"}},
			{"TiersNotArray", planWith(`{"model":"graduated","tiers":{}}`), map[string]string{
				"prices.m.tiers": `must be an array of tiers, such as [{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1"}]`}},
			{"TiersTooMany", planWith(`{"model":"graduated","tiers":[` + strings.Join(tiers, ",") + `]}`), map[string]string{
				"prices.m.tiers": "has 101 tiers; send at most 100"}},
			{"UnknownField", `{"currency":"usd","prices":{},"version":2}`, map[string]string{
				"version": "is not a known field; a plan takes currency and prices"}},
		}
		for _, tt := range tests {
			_, err := pricing.ParsePlan([]byte(tt.in))
			requireFields(t, err, tt.want)
		}
	})

	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()
		for _, in := range []string{``, `{`, `[]`, `"usd"`, `null`, `{} {}`, `{"currency":"usd",}`} {
			_, err := pricing.ParsePlan([]byte(in))
			require.ErrorIs(t, err, pricing.ErrMalformedPlan, in)
		}
	})

	t.Run("MessageNamesPath", func(t *testing.T) {
		t.Parallel()
		_, err := pricing.ParsePlan([]byte(`{"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":"10","unit_amount":"0.1"},{"up_to":null,"unit_amount":"0"}]}}}`))
		require.EqualError(t, err, "invalid plan: prices.api_calls.tiers[1].up_to: must be greater than the previous tier's up_to (1000)")
	})

	t.Run("UnmarshalJSON", func(t *testing.T) {
		t.Parallel()
		var p pricing.Plan
		require.NoError(t, p.UnmarshalJSON([]byte(planWith(`{"model":"per_unit","unit_amount":"2"}`))))
		require.Equal(t, "usd", p.Currency)
		unit := p.Prices["m"].UnitAmount
		require.Equal(t, "2", unit.Text('f'))
		requireFields(t, p.UnmarshalJSON([]byte(`{"currency":"usd"}`)), map[string]string{
			"prices": `is required; send an object of prices by metric, such as {"api_calls":{"model":"per_unit","unit_amount":"0.025"}}, or {} for none`})
	})
}

func TestPlanValidate(t *testing.T) {
	t.Parallel()

	one := *apd.New(1, 0)
	tests := []struct {
		name  string
		price pricing.Price
		want  map[string]string
	}{
		{"NaN", pricing.Price{Model: pricing.ModelPerUnit, UnitAmount: apd.Decimal{Form: apd.NaN}},
			map[string]string{"prices.m.unit_amount": "must be a finite decimal"}},
		{"Negative", pricing.Price{Model: pricing.ModelPerUnit, UnitAmount: *apd.New(-25, -3)},
			map[string]string{"prices.m.unit_amount": "must not be negative; got -0.025"}},
		{"TiersOnPackage", pricing.Price{Model: pricing.ModelPackage, PackageSize: one, UnitAmount: one, Tiers: []pricing.Tier{{UnitAmount: one}}},
			map[string]string{"prices.m.tiers": "is not used by the package model; a package price takes model, package_size, unit_amount, minimum_amount"}},
		{"UnitAmountOnVolume", pricing.Price{Model: pricing.ModelVolume, UnitAmount: one, Tiers: []pricing.Tier{{UnitAmount: one}}},
			map[string]string{"prices.m.unit_amount": "is not used by the volume model; a volume price takes model, tiers, minimum_amount"}},
		{"Valid", pricing.Price{Model: pricing.ModelVolume, Tiers: []pricing.Tier{{UpTo: &one}, {FlatAmount: one}}}, nil},
	}
	for _, tt := range tests {
		p := pricing.Plan{Currency: "usd", Prices: map[string]pricing.Price{"m": tt.price}}
		err := p.Validate()
		_, encodeErr := p.MarshalJSON()
		if tt.want == nil {
			require.NoError(t, err, tt.name)
			require.NoError(t, encodeErr, tt.name)
			continue
		}
		requireFields(t, err, tt.want)
		require.EqualError(t, encodeErr, err.Error(), tt.name)
	}

	require.Error(t, pricing.Plan{Currency: "USD"}.Validate(), "a hand-built plan's currency is not lower-cased for it")
}

func TestParseQuantity(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]string{
		"0": "0", "0.000": "0", "12.5": "12.5", "1e3": "1000", "1.5E-11": "0.000000000015",
		"1000000000000000000": "1000000000000000000", "0.000000001": "0.000000001",
		"99999999999999999999.999999999999": "99999999999999999999.999999999999",
		"2.500000000000000":                 "2.5",
	} {
		q, err := pricing.ParseQuantity(in)
		require.NoError(t, err, in)
		require.Equal(t, want, q.Text('f'), in)
	}
	for in, want := range map[string]string{
		"-1":                           "must not be negative; got -1",
		"1.0000000000001":              "has 13 digits after the point; send at most 12",
		"1e20":                         "has 21 digits before the point; send at most 20",
		"1e-13":                        "has 13 digits after the point; send at most 12",
		"1e99999999999":                `is out of range; send a decimal such as "12.5"`,
		"":                             `must be a decimal such as "12.5"; got ""`,
		"NaN":                          `must be a decimal such as "12.5"; got "NaN"`,
		"Infinity":                     `must be a decimal such as "12.5"; got "Infinity"`,
		"0x10":                         `must be a decimal such as "12.5"; got "0x10"`,
		".5":                           `must be a decimal such as "12.5"; got ".5"`,
		"+1":                           `must be a decimal such as "12.5"; got "+1"`,
		"01":                           `must be a decimal such as "12.5"; got "01"`,
		strings.Repeat("9", 50):        "has 50 digits before the point; send at most 20",
		"-1e99999":                     "has 100000 digits before the point; send at most 20",
		"0." + strings.Repeat("0", 99): `is 101 characters long; send at most 100, such as "12.5"`,
		"1x" + strings.Repeat("9", 50): `must be a decimal such as "12.5"; got "1x99999999999999999999999999999999999999…"`,
	} {
		_, err := pricing.ParseQuantity(in)
		require.EqualError(t, err, want, in)
	}
}
