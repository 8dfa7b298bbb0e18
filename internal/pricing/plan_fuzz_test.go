package pricing_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cockroachdb/apd/v3"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/pricing"
)

// FuzzPlanDecode requires ParsePlan never to panic and to refuse only with
// a *ValidationError or ErrMalformedPlan; an accepted plan must encode,
// decode back to the same plan and the same bytes, and rate at zero, one,
// its tier bounds and 1e18 without panicking.
func FuzzPlanDecode(f *testing.F) {
	for _, seed := range []string{
		`{"currency":"usd","prices":{"api_calls":{"model":"per_unit","unit_amount":"0.025"}}}`,
		`{"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1","flat_amount":"0"}]}}}`,
		`{"currency":"EUR","prices":{"gb_hours":{"model":"volume","tiers":[{"up_to":"1e3","unit_amount":"0.50"},{"unit_amount":"0.000000000001","flat_amount":"5"}],"minimum_amount":"100"}}}`,
		`{"currency":"usd","prices":{"seats":{"model":"package","package_size":"100","unit_amount":"250"},"tokens":{"model":"per_unit","unit_amount":"0"}}}`,
		`{"currency":"usd","prices":{}}`,
		`{"currency":"usd","prices":{"m":{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":"10","unit_amount":"0.1"},{"up_to":null,"unit_amount":"0"}]}}}`,
		`{"currency":"usd","currency":"usd","prices":{"m":{"model":"package","package_amount":"1"}}}`,
		`{"currency":"usd","prices":{"m":{"model":"per_unit","unit_amount":0.5}}}`,
		`[{"currency":"usd"}]`,
		`{"currency":"usd","prices":{"m":{"model":"per_unit","unit_amount":"99999999999999999999.999999999999"}}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := pricing.ParsePlan(data)
		if err != nil {
			var ve *pricing.ValidationError
			if !errors.As(err, &ve) && !errors.Is(err, pricing.ErrMalformedPlan) {
				t.Fatalf("ParsePlan(%q) = %v, neither a *ValidationError nor ErrMalformedPlan", data, err)
			}
			return
		}
		encoded, err := p.MarshalJSON()
		require.NoError(t, err)
		again, err := pricing.ParsePlan(encoded)
		require.NoError(t, err, "decoding the canonical encoding %s", encoded)
		requirePlanEqual(t, p, again)
		reencoded, err := again.MarshalJSON()
		require.NoError(t, err)
		require.Equal(t, string(encoded), string(reencoded))

		for _, price := range p.Prices {
			quantities := []apd.Decimal{{}, *apd.New(1, 0), *apd.New(1, 18)}
			for _, tier := range price.Tiers {
				if tier.UpTo != nil {
					quantities = append(quantities, *tier.UpTo)
				}
			}
			for _, q := range quantities {
				if _, err := pricing.Rate(price, q); err != nil && !strings.Contains(err.Error(), "does not fit in an int64") {
					t.Fatalf("Rate(%s) at %s: %v", encoded, q.Text('f'), err)
				}
			}
		}
	})
}

// requirePlanEqual requires a and b to hold the same plan, comparing
// decimals by value.
func requirePlanEqual(t *testing.T, a, b pricing.Plan) {
	t.Helper()
	require.Equal(t, a.Currency, b.Currency)
	require.Len(t, b.Prices, len(a.Prices))
	same := func(x, y apd.Decimal, what string) {
		require.Zero(t, x.Cmp(&y), "%s: %s and %s", what, x.Text('f'), y.Text('f'))
	}
	for metric, pa := range a.Prices {
		pb, ok := b.Prices[metric]
		require.True(t, ok, metric)
		require.Equal(t, pa.Model, pb.Model, metric)
		same(pa.UnitAmount, pb.UnitAmount, metric+".unit_amount")
		same(pa.PackageSize, pb.PackageSize, metric+".package_size")
		same(pa.MinimumAmount, pb.MinimumAmount, metric+".minimum_amount")
		require.Len(t, pb.Tiers, len(pa.Tiers), metric)
		for i, ta := range pa.Tiers {
			tb := pb.Tiers[i]
			same(ta.UnitAmount, tb.UnitAmount, metric+".tiers.unit_amount")
			same(ta.FlatAmount, tb.FlatAmount, metric+".tiers.flat_amount")
			require.Equal(t, ta.UpTo == nil, tb.UpTo == nil, metric+".tiers.up_to")
			if ta.UpTo != nil {
				same(*ta.UpTo, *tb.UpTo, metric+".tiers.up_to")
			}
		}
	}
}
