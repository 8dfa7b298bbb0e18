package chaos

import (
	"fmt"
	"math/big"
)

// The chaos check rates quantities itself, with this file's code: exact
// fractions (math/big.Rat), the models as docs/design.md describes them,
// and one rounding per line, half-up to the cent. It shares nothing with
// internal/pricing, so a rating bug there shows as a line that differs.

// tierDef is one tier of a graduated or volume price, as PUT
// /v1/plans/{plan_id} takes it; UpTo nil is the open-ended last tier.
type tierDef struct {
	UpTo       *string `json:"up_to"`
	UnitAmount string  `json:"unit_amount"`
	FlatAmount string  `json:"flat_amount,omitempty"`
}

// priceDef is one metric's price, as the API takes it.
type priceDef struct {
	Model         string    `json:"model"`
	UnitAmount    string    `json:"unit_amount,omitempty"`
	PackageSize   string    `json:"package_size,omitempty"`
	Tiers         []tierDef `json:"tiers,omitempty"`
	MinimumAmount string    `json:"minimum_amount,omitempty"`
}

// planDef is a plan version's price book, as the API takes it.
type planDef struct {
	Currency string              `json:"currency"`
	Prices   map[string]priceDef `json:"prices"`
}

// planBook is every plan version the run put: plan id → version → prices,
// the versions numbered as the API answered.
type planBook map[string]map[int32]planDef

func (b planBook) add(id string, version int32, p planDef) {
	if b[id] == nil {
		b[id] = map[int32]planDef{}
	}
	b[id][version] = p
}

// chaosPlanID is the plan a third of the run's customers are on.
const chaosPlanID = "chaos-tiered"

// chaosPlanVersions are the contents the run puts for chaosPlanID: the
// first before any event, the second during the load (periods opened after
// it are rated with it; those opened before keep the first). Unit amounts
// with half cents make the half-up rounding matter; the tier bounds are
// where chaosTargets puts some periods' quantities exactly.
var chaosPlanVersions = []planDef{
	{Currency: "usd", Prices: map[string]priceDef{
		"api_calls": {Model: "graduated", Tiers: []tierDef{
			{UpTo: ptr("1000"), UnitAmount: "0.5"},
			{UpTo: ptr("10000"), UnitAmount: "0.25", FlatAmount: "100"},
			{UnitAmount: "0.1"},
		}},
		"storage_gb": {Model: "volume", MinimumAmount: "75", Tiers: []tierDef{
			{UpTo: ptr("10"), UnitAmount: "30.5"},
			{UpTo: ptr("100"), UnitAmount: "20", FlatAmount: "50"},
			{UnitAmount: "12.5"},
		}},
		"seats": {Model: "package", PackageSize: "5", UnitAmount: "999.5"},
	}},
	{Currency: "usd", Prices: map[string]priceDef{
		"api_calls": {Model: "graduated", MinimumAmount: "250", Tiers: []tierDef{
			{UpTo: ptr("1000"), UnitAmount: "0.45"},
			{UpTo: ptr("10000"), UnitAmount: "0.2", FlatAmount: "40.5"},
			{UnitAmount: "0.075"},
		}},
		"storage_gb": {Model: "volume", Tiers: []tierDef{
			{UpTo: ptr("10"), UnitAmount: "28"},
			{UpTo: ptr("100"), UnitAmount: "18.25"},
			{UnitAmount: "11", FlatAmount: "300"},
		}},
		"seats": {Model: "package", PackageSize: "10", UnitAmount: "1800.25", MinimumAmount: "2000"},
	}},
}

func ptr[T any](v T) *T { return &v }

// rat reads a decimal string exactly.
func rat(s string) (*big.Rat, error) {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, fmt.Errorf("%q is not a decimal", s)
	}
	return r, nil
}

// ratOr is rat(s), or zero for "".
func ratOr(s string) (*big.Rat, error) {
	if s == "" {
		return new(big.Rat), nil
	}
	return rat(s)
}

// rateQuantity prices quantity q ≥ 0 under p: the exact amount in cents
// (after the minimum) and that amount rounded half-up to a whole cent. A
// zero quantity comes to zero in every model.
func rateQuantity(p priceDef, q *big.Rat) (*big.Rat, int64, error) {
	if q.Sign() < 0 {
		return nil, 0, fmt.Errorf("negative quantity %s", q.FloatString(12))
	}
	amount := new(big.Rat)
	if q.Sign() == 0 {
		return amount, 0, nil
	}
	unit, err := ratOr(p.UnitAmount)
	if err != nil {
		return nil, 0, err
	}
	switch p.Model {
	case "per_unit":
		amount.Mul(q, unit)
	case "package":
		size, err := rat(p.PackageSize)
		if err != nil {
			return nil, 0, err
		}
		packages := ceilRat(new(big.Rat).Quo(q, size))
		amount.Mul(new(big.Rat).SetInt(packages), unit)
	case "graduated":
		// Each unit in the tier it falls in; a tier's flat amount once the
		// quantity is above the tier's lower bound.
		lower := new(big.Rat)
		for _, t := range p.Tiers {
			if q.Cmp(lower) <= 0 {
				break
			}
			top := q
			var upTo *big.Rat
			if t.UpTo != nil {
				if upTo, err = rat(*t.UpTo); err != nil {
					return nil, 0, err
				}
				if upTo.Cmp(q) < 0 {
					top = upTo
				}
			}
			part, err := tierAmount(t, new(big.Rat).Sub(top, lower))
			if err != nil {
				return nil, 0, err
			}
			amount.Add(amount, part)
			if upTo == nil {
				break
			}
			lower = upTo
		}
	case "volume":
		// The whole quantity at the first tier whose bound it does not exceed.
		for _, t := range p.Tiers {
			if t.UpTo != nil {
				upTo, err := rat(*t.UpTo)
				if err != nil {
					return nil, 0, err
				}
				if q.Cmp(upTo) > 0 {
					continue
				}
			}
			if amount, err = tierAmount(t, q); err != nil {
				return nil, 0, err
			}
			break
		}
	default:
		return nil, 0, fmt.Errorf("unknown model %q", p.Model)
	}
	minimum, err := ratOr(p.MinimumAmount)
	if err != nil {
		return nil, 0, err
	}
	if amount.Cmp(minimum) < 0 {
		amount = minimum
	}
	return amount, roundHalfUp(amount), nil
}

// tierAmount is units × the tier's unit amount plus its flat amount.
func tierAmount(t tierDef, units *big.Rat) (*big.Rat, error) {
	unit, err := rat(t.UnitAmount)
	if err != nil {
		return nil, err
	}
	flat, err := ratOr(t.FlatAmount)
	if err != nil {
		return nil, err
	}
	return new(big.Rat).Add(new(big.Rat).Mul(units, unit), flat), nil
}

// ceilRat is ⌈r⌉ for r ≥ 0.
func ceilRat(r *big.Rat) *big.Int {
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// roundHalfUp is r ≥ 0 rounded to the nearest integer, halves up:
// ⌊(2·num + den) / (2·den)⌋.
func roundHalfUp(r *big.Rat) int64 {
	num := new(big.Int).Add(new(big.Int).Lsh(r.Num(), 1), r.Denom())
	return new(big.Int).Quo(num, new(big.Int).Lsh(r.Denom(), 1)).Int64()
}
