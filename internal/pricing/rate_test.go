package pricing_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cockroachdb/apd/v3"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/pricing"
)

// dec parses s, which may be negative, for a test.
func dec(t *testing.T, s string) apd.Decimal {
	t.Helper()
	d, _, err := apd.NewFromString(s)
	require.NoError(t, err, s)
	return *d
}

// price parses one price body, for a test.
func price(t *testing.T, body string) pricing.Price {
	t.Helper()
	p, err := pricing.ParsePlan([]byte(planWith(body)))
	require.NoError(t, err, body)
	return p.Prices["m"]
}

// tierSummary is a TierLine as "tier:quantity×unit+flat=amount".
func tierSummary(l pricing.TierLine) string {
	b, _ := json.Marshal(l)
	return string(b)
}

func TestRate(t *testing.T) {
	t.Parallel()

	const (
		perUnit   = `{"model":"per_unit","unit_amount":"0.025"}`
		graduated = `{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":"5000","unit_amount":"0.2","flat_amount":"100"},{"up_to":null,"unit_amount":"0.1","flat_amount":"50"}]}`
		volume    = `{"model":"volume","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":"5000","unit_amount":"0.2","flat_amount":"100"},{"up_to":null,"unit_amount":"0.1","flat_amount":"50"}]}`
		pkg       = `{"model":"package","package_size":"100","unit_amount":"250"}`
		minimum   = `{"model":"per_unit","unit_amount":"0.025","minimum_amount":"100"}`
	)
	tests := []struct {
		name, price, quantity string
		exact                 string // the exact amount rounded
		amount                int64
		tiers                 []string // each tier's JSON, for tiered models
	}{
		{"GraduatedAboveBoundary", graduated, "1000.000000001", "600.0000000002", 600, []string{
			`{"tier":0,"quantity":"1000","unit_amount":"0.5","flat_amount":"0","amount":"500"}`,
			`{"tier":1,"quantity":"0.000000001","unit_amount":"0.2","flat_amount":"100","amount":"100.0000000002"}`}},
		{"GraduatedAtBoundary", graduated, "1000", "500", 500, []string{
			`{"tier":0,"quantity":"1000","unit_amount":"0.5","flat_amount":"0","amount":"500"}`}},
		{"GraduatedAtSecondBoundary", graduated, "5000", "1400", 1400, []string{
			`{"tier":0,"quantity":"1000","unit_amount":"0.5","flat_amount":"0","amount":"500"}`,
			`{"tier":1,"quantity":"4000","unit_amount":"0.2","flat_amount":"100","amount":"900"}`}},
		{"GraduatedHuge", graduated, "1000000000000000000", "100000000000000950", 100000000000000950, []string{
			`{"tier":0,"quantity":"1000","unit_amount":"0.5","flat_amount":"0","amount":"500"}`,
			`{"tier":1,"quantity":"4000","unit_amount":"0.2","flat_amount":"100","amount":"900"}`,
			`{"tier":2,"quantity":"999999999999995000","unit_amount":"0.1","flat_amount":"50","amount":"99999999999999550"}`}},
		{"GraduatedLastTier", graduated, "5001", "1450.1", 1450, []string{
			`{"tier":0,"quantity":"1000","unit_amount":"0.5","flat_amount":"0","amount":"500"}`,
			`{"tier":1,"quantity":"4000","unit_amount":"0.2","flat_amount":"100","amount":"900"}`,
			`{"tier":2,"quantity":"1","unit_amount":"0.1","flat_amount":"50","amount":"50.1"}`}},
		{"GraduatedTiny", graduated, "0.000000001", "0.0000000005", 0, []string{
			`{"tier":0,"quantity":"0.000000001","unit_amount":"0.5","flat_amount":"0","amount":"0.0000000005"}`}},
		{"GraduatedZero", graduated, "0", "0", 0, nil},
		{"MinimumAbove", minimum, "10000", "250", 250, nil},
		{"MinimumApplies", minimum, "1", "100", 100, nil},
		{"MinimumNotOnZero", minimum, "0", "0", 0, nil},
		{"MinimumRoundedOnce", `{"model":"per_unit","unit_amount":"0.1","minimum_amount":"0.5"}`, "0.000000000001", "0.5", 1, nil},
		{"PackageFraction", `{"model":"package","package_size":"0.5","unit_amount":"1"}`, "1.2", "3", 3, nil},
		{"PackageFull", pkg, "100", "250", 250, nil},
		{"PackageHuge", pkg, "1000000000000000000", "2500000000000000000", 2500000000000000000, nil},
		{"PackageOne", pkg, "1", "250", 250, nil},
		{"PackageStarted", pkg, "100.000000001", "500", 500, nil},
		{"PackageZero", pkg, "0", "0", 0, nil},
		{"PerUnit", perUnit, "1000", "25", 25, nil},
		{"PerUnitHalfDown", perUnit, "19.999999999999", "0.499999999999975", 0, nil},
		{"PerUnitHalfUp", perUnit, "20", "0.5", 1, nil},
		{"PerUnitHalfUpNotEven", perUnit, "100", "2.5", 3, nil},
		{"PerUnitHuge", perUnit, "1000000000000000000", "25000000000000000", 25000000000000000, nil},
		{"PerUnitManyDecimals", `{"model":"per_unit","unit_amount":"1000000"}`, "0.000000001", "0.001", 0, nil},
		{"PerUnitZero", perUnit, "0", "0", 0, nil},
		{"VolumeAboveBoundary", volume, "1000.5", "300.1", 300, []string{
			`{"tier":1,"quantity":"1000.5","unit_amount":"0.2","flat_amount":"100","amount":"300.1"}`}},
		{"VolumeAtBoundary", volume, "1000", "500", 500, []string{
			`{"tier":0,"quantity":"1000","unit_amount":"0.5","flat_amount":"0","amount":"500"}`}},
		{"VolumeHuge", volume, "1000000000000000000", "100000000000000050", 100000000000000050, []string{
			`{"tier":2,"quantity":"1000000000000000000","unit_amount":"0.1","flat_amount":"50","amount":"100000000000000050"}`}},
		{"VolumeLastTier", volume, "5000.000000001", "550.0000000001", 550, []string{
			`{"tier":2,"quantity":"5000.000000001","unit_amount":"0.1","flat_amount":"50","amount":"550.0000000001"}`}},
		{"VolumeZero", volume, "0", "0", 0, nil},
	}
	for _, tt := range tests {
		li, err := pricing.Rate(price(t, tt.price), dec(t, tt.quantity))
		require.NoError(t, err, tt.name)
		require.Equal(t, tt.exact, li.Exact.Text('f'), tt.name)
		require.Equal(t, tt.amount, li.Amount, tt.name)
		var tiers []string
		for _, l := range li.Tiers {
			tiers = append(tiers, tierSummary(l))
		}
		require.Equal(t, tt.tiers, tiers, tt.name)
	}
}

func TestRateLineItem(t *testing.T) {
	t.Parallel()

	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		li, err := pricing.Rate(price(t, `{"model":"package","package_size":"100","unit_amount":"0.5","minimum_amount":"2"}`), dec(t, "150.0"))
		require.NoError(t, err)
		b, err := json.Marshal(li)
		require.NoError(t, err)
		require.JSONEq(t, `{"model":"package","quantity":"150","packages":"2","subtotal":"1","minimum_applied":true,"exact":"2","amount":2}`, string(b))

		li, err = pricing.Rate(price(t, `{"model":"volume","tiers":[{"up_to":null,"unit_amount":"0.5"}]}`), dec(t, "1E+3"))
		require.NoError(t, err)
		b, err = json.Marshal(li)
		require.NoError(t, err)
		require.JSONEq(t, `{"model":"volume","quantity":"1000","tiers":[{"tier":0,"quantity":"1000","unit_amount":"0.5","flat_amount":"0","amount":"500"}],"subtotal":"500","minimum_applied":false,"exact":"500","amount":500}`, string(b))
	})

	t.Run("SubtotalIsSumOfTiers", func(t *testing.T) {
		t.Parallel()
		li, err := pricing.Rate(price(t, `{"model":"graduated","tiers":[{"up_to":"1","unit_amount":"0.3","flat_amount":"0.3"},{"up_to":null,"unit_amount":"0.3","flat_amount":"0.3"}],"minimum_amount":"0.1"}`), dec(t, "2"))
		require.NoError(t, err)
		require.Equal(t, "1.2", li.Subtotal.Text('f'))
		require.False(t, li.MinimumApplied)
		require.Equal(t, int64(1), li.Amount, "1.2 is rounded once, not 0.6 + 0.6 rounded to 1 + 1")
	})

	t.Run("PriceNotModified", func(t *testing.T) {
		t.Parallel()
		p := price(t, `{"model":"graduated","tiers":[{"up_to":"10","unit_amount":"1"},{"up_to":null,"unit_amount":"2"}]}`)
		before, err := pricing.Plan{Currency: "usd", Prices: map[string]pricing.Price{"m": p}}.MarshalJSON()
		require.NoError(t, err)
		q := dec(t, "25")
		_, err = pricing.Rate(p, q)
		require.NoError(t, err)
		after, err := pricing.Plan{Currency: "usd", Prices: map[string]pricing.Price{"m": p}}.MarshalJSON()
		require.NoError(t, err)
		require.Equal(t, string(before), string(after))
		require.Equal(t, "25", q.Text('f'))
	})
}

func TestRateRefuses(t *testing.T) {
	t.Parallel()

	perUnit := price(t, `{"model":"per_unit","unit_amount":"1"}`)

	_, err := pricing.Rate(perUnit, dec(t, "-0.5"))
	require.ErrorIs(t, err, pricing.ErrNegativeQuantity)
	require.EqualError(t, err, "error rating quantity -0.5: quantity is negative; voids lower a period's quantity but never below zero, so the events behind it are inconsistent")

	li, err := pricing.Rate(perUnit, dec(t, "-0"))
	require.NoError(t, err, "negative zero is zero")
	require.Equal(t, "0", li.Quantity.Text('f'))

	_, err = pricing.Rate(perUnit, dec(t, "0.0000000000001"))
	require.EqualError(t, err, "error rating quantity 1E-13: it has 13 digits after the point; send at most 12")

	_, err = pricing.Rate(perUnit, *apd.New(-1, 99999))
	require.EqualError(t, err, "error rating quantity -1E+99999: it has 100000 digits before the point; send at most 20")

	_, err = pricing.Rate(perUnit, dec(t, "1"+strings.Repeat("0", 100)+"e-100"))
	require.EqualError(t, err, "error rating quantity 1.00000000000000000000000000000000000000…: it has 101 digits; send at most 100")

	_, err = pricing.Rate(perUnit, dec(t, "NaN"))
	require.EqualError(t, err, "error rating quantity NaN: it must be a finite decimal")

	_, err = pricing.Rate(price(t, `{"model":"per_unit","unit_amount":"10"}`), dec(t, "99999999999999999999"))
	require.EqualError(t, err, "error rating quantity 99999999999999999999: the amount 999999999999999999990 minor units does not fit in an int64")

	_, err = pricing.Rate(pricing.Price{Model: pricing.ModelGraduated}, dec(t, "1"))
	require.EqualError(t, err, `error rating: invalid plan: price.tiers: must have at least one tier; send [{"up_to":null,"unit_amount":"0.5"}] for a single one`)

	_, err = pricing.Rate(pricing.Price{Model: "flat"}, dec(t, "1"))
	require.ErrorContains(t, err, `price.model: must be one of per_unit, graduated, volume, package; got "flat"`)
}
