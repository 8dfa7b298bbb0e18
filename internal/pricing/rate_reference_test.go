package pricing_test

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/apd/v3"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/pricing"
)

// The property tests compare Rate with two reference implementations that
// share none of its code and none of apd: refUnits walks a small quantity
// unit by unit over scaled integers, refRat follows the contract's
// formulas in big.Rat for any quantity. Both use a fixed seed, so a failure
// reproduces; the iteration counts keep the run to about a second.

// refTier is a tier for the references: upTo nil when open-ended.
type refTier struct {
	upTo       *big.Rat
	unit, flat *big.Rat
}

// refPrice is a price for the references.
type refPrice struct {
	model      pricing.Model
	unit, size *big.Rat
	tiers      []refTier
	minimum    *big.Rat
	quantity   *big.Rat
	scale      int64 // refUnits: every value is a multiple of 10^-scale
}

// ratOf is d as a big.Rat.
func ratOf(d *apd.Decimal) *big.Rat {
	r, ok := new(big.Rat).SetString(d.Text('f'))
	if !ok {
		panic("not a decimal: " + d.Text('f'))
	}
	return r
}

// decimal is coeff × 10^-scale in both forms.
func decimal(coeff int64, scale int32) (apd.Decimal, *big.Rat) {
	r := new(big.Rat).SetFrac(big.NewInt(coeff), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(scale)), nil))
	return *apd.New(coeff, -scale), r
}

// roundHalfUp is ⌊x + ½⌋ for x ≥ 0, or false when it exceeds an int64.
func roundHalfUp(x *big.Rat) (int64, bool) {
	num := new(big.Int).Mul(x.Num(), big.NewInt(2))
	num.Add(num, x.Denom())
	den := new(big.Int).Mul(x.Denom(), big.NewInt(2))
	q := new(big.Int).Quo(num, den)
	return q.Int64(), q.IsInt64()
}

// refRat is the exact amount by the contract's formulas.
func refRat(p refPrice) *big.Rat {
	q := p.quantity
	sum := new(big.Rat)
	if q.Sign() > 0 {
		switch p.model {
		case pricing.ModelPerUnit:
			sum.Mul(q, p.unit)
		case pricing.ModelPackage:
			quo := new(big.Rat).Quo(q, p.size)
			packages := new(big.Int).Quo(quo.Num(), quo.Denom()) // ⌊q / size⌋
			if !quo.IsInt() {
				packages.Add(packages, big.NewInt(1))
			}
			sum.Mul(new(big.Rat).SetInt(packages), p.unit)
		case pricing.ModelGraduated:
			lower := new(big.Rat)
			for _, t := range p.tiers {
				if q.Cmp(lower) <= 0 {
					break
				}
				in := new(big.Rat).Set(q)
				if t.upTo != nil && t.upTo.Cmp(q) < 0 {
					in.Set(t.upTo)
				}
				in.Sub(in, lower)
				sum.Add(sum, in.Mul(in, t.unit))
				sum.Add(sum, t.flat)
				if t.upTo != nil {
					lower = t.upTo
				}
			}
		case pricing.ModelVolume:
			for _, t := range p.tiers {
				if t.upTo == nil || q.Cmp(t.upTo) <= 0 {
					sum.Mul(q, t.unit)
					sum.Add(sum, t.flat)
					break
				}
			}
		}
	}
	if q.Sign() > 0 && sum.Cmp(p.minimum) < 0 {
		sum.Set(p.minimum)
	}
	return sum
}

// refUnits is the exact amount found by walking the quantity in steps of
// 10^-scale: each step is priced in the tier holding it, a tier holding
// any step adds its flat amount, a package starts at every size-th step.
func refUnits(p refPrice) *big.Rat {
	step := new(big.Rat).SetFrac(big.NewInt(1), new(big.Int).Exp(big.NewInt(10), big.NewInt(p.scale), nil))
	scaled := func(r *big.Rat) int64 { // r / step, a whole number by construction
		s := new(big.Rat).Quo(r, step)
		if !s.IsInt() {
			panic(fmt.Sprintf("%s is not a multiple of the step", r.FloatString(12)))
		}
		return s.Num().Int64()
	}
	n := scaled(p.quantity)
	bounds := make([]int64, len(p.tiers)) // in steps; MaxInt64 when open-ended
	for i, t := range p.tiers {
		bounds[i] = math.MaxInt64
		if t.upTo != nil {
			bounds[i] = scaled(t.upTo)
		}
	}
	tierOf := func(j int64) int { // the tier holding step j (1-based)
		for i, b := range bounds {
			if j <= b {
				return i
			}
		}
		panic("no open-ended tier")
	}
	var packageSize int64
	if p.model == pricing.ModelPackage {
		packageSize = scaled(p.size)
	}
	sum := new(big.Rat)
	reached := map[int]bool{}
	for j := int64(1); j <= n; j++ {
		switch p.model {
		case pricing.ModelPerUnit:
			sum.Add(sum, new(big.Rat).Mul(step, p.unit))
		case pricing.ModelPackage:
			if (j-1)%packageSize == 0 {
				sum.Add(sum, p.unit)
			}
		case pricing.ModelGraduated:
			i := tierOf(j)
			sum.Add(sum, new(big.Rat).Mul(step, p.tiers[i].unit))
			if !reached[i] {
				reached[i] = true
				sum.Add(sum, p.tiers[i].flat)
			}
		case pricing.ModelVolume:
			i := tierOf(n) // every step at the tier the whole reaches
			sum.Add(sum, new(big.Rat).Mul(step, p.tiers[i].unit))
			if j == n {
				sum.Add(sum, p.tiers[i].flat)
			}
		}
	}
	if n > 0 && sum.Cmp(p.minimum) < 0 {
		sum.Set(p.minimum)
	}
	return sum
}

// gen draws random prices and quantities.
type gen struct {
	rnd *rand.Rand
}

// below is a random whole number in [0, max), of a random number of
// digits, so that small numbers are as likely as large ones.
func (g gen) below(max int64) int64 {
	limit := int64(1)
	for range g.rnd.IntN(19) {
		if limit > max/10 {
			break
		}
		limit *= 10
	}
	return g.rnd.Int64N(min(limit, max))
}

// amount is a random non-negative decimal of at most digits digits, scale
// of them after the point; zero one time in five.
func (g gen) amount(digits, scale int32) (apd.Decimal, *big.Rat) {
	if g.rnd.IntN(5) == 0 {
		return decimal(0, 0)
	}
	return decimal(g.below(int64(math.Pow10(int(digits))))+1, scale)
}

// price draws a price of model m whose values are multiples of 10^-scale,
// with up to maxTiers tiers bounded below maxBound (in steps) and amounts of
// up to amountDigits digits. It returns the price for Rate and for the
// references.
func (g gen) price(m pricing.Model, scale int32, maxTiers int, maxBound int64, amountDigits int32) (pricing.Price, refPrice) {
	p := pricing.Price{Model: m}
	r := refPrice{model: m, scale: int64(scale), minimum: new(big.Rat)}
	amountScale := min(scale+int32(g.rnd.IntN(4)), pricing.MaxFractionDigits)
	switch m {
	case pricing.ModelPerUnit:
		p.UnitAmount, r.unit = g.amount(amountDigits, amountScale)
	case pricing.ModelPackage:
		p.UnitAmount, r.unit = g.amount(amountDigits, amountScale)
		p.PackageSize, r.size = decimal(g.below(maxBound/4+1)+1, scale)
	case pricing.ModelGraduated, pricing.ModelVolume:
		bounds := map[int64]bool{}
		for range g.rnd.IntN(maxTiers) {
			bounds[g.below(maxBound)+1] = true
		}
		sorted := slices.Sorted(func(yield func(int64) bool) {
			for b := range bounds {
				if !yield(b) {
					return
				}
			}
		})
		for _, b := range append(sorted, 0) {
			var t pricing.Tier
			var rt refTier
			t.UnitAmount, rt.unit = g.amount(amountDigits, amountScale)
			t.FlatAmount, rt.flat = g.amount(amountDigits, amountScale)
			if b != 0 {
				upTo, upToRat := decimal(b, scale)
				t.UpTo, rt.upTo = &upTo, upToRat
			}
			p.Tiers = append(p.Tiers, t)
			r.tiers = append(r.tiers, rt)
		}
	}
	if g.rnd.IntN(3) == 0 {
		p.MinimumAmount, r.minimum = g.amount(amountDigits, amountScale)
	}
	return p, r
}

// quantity draws a quantity for p: a tier bound or a bound ± one step one
// time in three, else a random number of steps up to maxQuantity.
func (g gen) quantity(p refPrice, maxQuantity int64) (apd.Decimal, *big.Rat) {
	scale := int32(p.scale)
	if len(p.tiers) > 1 && g.rnd.IntN(3) == 0 {
		b := p.tiers[g.rnd.IntN(len(p.tiers)-1)].upTo
		steps := new(big.Rat).Mul(b, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(p.scale), nil)))
		return decimal(steps.Num().Int64()+g.rnd.Int64N(3)-1, scale)
	}
	return decimal(g.below(maxQuantity)+g.rnd.Int64N(2), scale)
}

// checkAgainst rates q under p and requires the line item to agree with
// the reference's exact amount want.
func checkAgainst(t *testing.T, p pricing.Price, q apd.Decimal, want *big.Rat, what string) {
	t.Helper()
	li, err := pricing.Rate(p, q)
	amount, fits := roundHalfUp(want)
	if !fits {
		require.ErrorContains(t, err, "does not fit in an int64", what)
		return
	}
	require.NoError(t, err, what)
	require.Equal(t, want.RatString(), ratOf(&li.Exact).RatString(), what)
	require.Equal(t, amount, li.Amount, what)
	tierSum := new(big.Rat)
	for _, l := range li.Tiers {
		tierSum.Add(tierSum, ratOf(&l.Amount))
	}
	if len(li.Tiers) > 0 {
		require.Equal(t, tierSum.RatString(), ratOf(&li.Subtotal).RatString(), what)
	}
}

// describe prints a price and quantity for a failure message.
func describe(seed uint64, i int, p pricing.Price, q apd.Decimal) string {
	b, _ := pricing.Plan{Currency: "usd", Prices: map[string]pricing.Price{"m": p}}.MarshalJSON()
	return fmt.Sprintf("seed %d, case %d: %s at quantity %s", seed, i, b, q.Text('f'))
}

var allModels = []pricing.Model{pricing.ModelPerUnit, pricing.ModelGraduated, pricing.ModelVolume, pricing.ModelPackage}

func TestRateMatchesUnitWalk(t *testing.T) {
	t.Parallel()

	const seed = 24
	g := gen{rand.New(rand.NewPCG(seed, seed))}
	for i := range 2000 {
		scale := int32(g.rnd.IntN(3))
		p, r := g.price(allModels[i%len(allModels)], scale, 5, 400, 3)
		q, qRat := g.quantity(r, 1500)
		r.quantity = qRat
		want := refUnits(r)
		require.Equal(t, refRat(r).RatString(), want.RatString(), "the references disagree")
		checkAgainst(t, p, q, want, describe(seed, i, p, q))
	}
}

func TestRateMatchesRat(t *testing.T) {
	t.Parallel()

	const seed = 2024
	g := gen{rand.New(rand.NewPCG(seed, seed))}
	for i := range 2000 {
		// Up to 12 digits after the point and 18 before, amounts of up to
		// 15 digits: the edges the unit walk cannot reach, and amounts past
		// an int64 now and then.
		scale := int32(g.rnd.IntN(pricing.MaxFractionDigits + 1))
		p, r := g.price(allModels[i%len(allModels)], scale, 8, math.MaxInt64/10, 15)
		q, qRat := g.quantity(r, math.MaxInt64-1)
		r.quantity = qRat
		checkAgainst(t, p, q, refRat(r), describe(seed, i, p, q))
	}
}
