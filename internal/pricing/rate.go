package pricing

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cockroachdb/apd/v3"
)

// ErrNegativeQuantity is returned, wrapped, by Rate for a quantity below
// zero. Voids may lower a period's quantity but never below zero, so a
// negative total means the events behind it are inconsistent; it is never
// rated as a credit.
var ErrNegativeQuantity = errors.New("quantity is negative")

// LineItem is what one metric's quantity comes to in a period under one
// price.
type LineItem struct {
	// Model is the price's model.
	Model Model
	// Quantity is the quantity rated.
	Quantity apd.Decimal
	// Tiers is the breakdown of a graduated price (each tier the quantity
	// reached, in order) or a volume price (the one tier that priced it);
	// nil for the other models and for a zero quantity.
	Tiers []TierLine
	// Packages is the number of packages started (package only).
	Packages apd.Decimal
	// Subtotal is the exact amount the model gives, before the minimum.
	Subtotal apd.Decimal
	// MinimumApplied says the quantity was above zero and Subtotal below the
	// price's minimum, so the line comes to the minimum instead.
	MinimumApplied bool
	// Exact is the line's exact amount: Subtotal, or the minimum when
	// MinimumApplied. It is what is rounded.
	Exact apd.Decimal
	// Amount is Exact rounded half-up to a whole minor unit: what the line
	// adds to the charge.
	Amount int64
}

// TierLine is one tier's part of a line item.
type TierLine struct {
	// Tier is the tier's index in the price's tiers, from 0.
	Tier int
	// Quantity is the units priced in this tier (for volume, the whole
	// quantity).
	Quantity apd.Decimal
	// UnitAmount and FlatAmount are the tier's.
	UnitAmount apd.Decimal
	FlatAmount apd.Decimal
	// Amount is Quantity × UnitAmount + FlatAmount, exact: tier amounts are
	// never rounded, only the line's total is.
	Amount apd.Decimal
}

// Rate prices quantity, a period's net quantity of one metric, under p.
//
// The model gives an exact amount (see the package doc); when the quantity
// is above zero and that amount is below p.MinimumAmount, the line comes to
// the minimum instead. That exact amount is then rounded half-up to a whole
// minor unit, once: the line's Amount. A charge is the sum of its line
// items' Amounts. A zero quantity rates to zero in every model: it reaches
// no tier, starts no package and owes no minimum.
//
// Rate returns an error for an invalid price (see Plan.Validate), a
// quantity beyond MaxIntegerDigits or MaxFractionDigits, a negative
// quantity (wrapping ErrNegativeQuantity), or an Amount that does not fit
// in an int64. It is a pure function: the same price and quantity give the
// same line item.
func Rate(p Price, quantity apd.Decimal) (LineItem, error) {
	fe := fieldErrors{}
	p.validate(fe, "price")
	if err := fe.err(); err != nil {
		return LineItem{}, fmt.Errorf("error rating: %w", err)
	}
	if problem := checkMagnitude(&quantity); problem != "" {
		return LineItem{}, fmt.Errorf("error rating quantity %s: it %s", truncate(quantity.String()), problem)
	}
	if quantity.Sign() < 0 {
		return LineItem{}, fmt.Errorf("error rating quantity %s: %w; voids lower a period's quantity but never below zero, so the events behind it are inconsistent",
			Text(&quantity), ErrNegativeQuantity)
	}
	li := LineItem{Model: p.Model, Quantity: reduced(&quantity)}
	if err := li.rate(p); err != nil {
		return LineItem{}, fmt.Errorf("error rating quantity %s: %w", Text(&quantity), err)
	}
	return li, nil
}

// rate fills li's amounts from li.Quantity under p.
func (li *LineItem) rate(p Price) error {
	q := &li.Quantity
	var c calc
	if q.Sign() > 0 {
		switch p.Model {
		case ModelPerUnit:
			li.Subtotal = c.mul(q, &p.UnitAmount)
		case ModelPackage:
			li.Packages = c.ceilQuo(q, &p.PackageSize)
			li.Subtotal = c.mul(&li.Packages, &p.UnitAmount)
		case ModelGraduated:
			li.Tiers = c.graduated(q, p.Tiers)
			li.Subtotal = c.sumTiers(li.Tiers)
		case ModelVolume:
			li.Tiers = c.volume(q, p.Tiers)
			li.Subtotal = c.sumTiers(li.Tiers)
		}
	}
	li.Exact = li.Subtotal
	if q.Sign() > 0 && li.Subtotal.Cmp(&p.MinimumAmount) < 0 {
		li.MinimumApplied = true
		li.Exact = reduced(&p.MinimumAmount)
	}
	if c.err != nil {
		return c.err
	}
	amount, err := roundToMinorUnit(&li.Exact)
	if err != nil {
		return err
	}
	li.Amount = amount
	return nil
}

// roundToMinorUnit rounds d half-up to a whole minor unit: the one rounding
// on the pricing path.
func roundToMinorUnit(d *apd.Decimal) (int64, error) {
	var r apd.Decimal
	if _, err := toMinorUnit.Quantize(&r, d, 0); err != nil {
		return 0, fmt.Errorf("error rounding %s: %w", Text(d), err)
	}
	n, err := r.Int64()
	if err != nil {
		return 0, fmt.Errorf("the amount %s minor units does not fit in an int64", Text(&r))
	}
	return n, nil
}

// calc runs exact arithmetic and keeps its first error, so a formula reads
// as one; an error means a result would have had to round, which the limits
// on inputs rule out.
type calc struct {
	err error
}

func (c *calc) do(op func(d *apd.Decimal) (apd.Condition, error)) apd.Decimal {
	var d apd.Decimal
	if c.err == nil {
		if _, err := op(&d); err != nil {
			c.err = err
		}
	}
	return reduced(&d)
}

func (c *calc) mul(x, y *apd.Decimal) apd.Decimal {
	return c.do(func(d *apd.Decimal) (apd.Condition, error) { return exact.Mul(d, x, y) })
}

func (c *calc) add(x, y *apd.Decimal) apd.Decimal {
	return c.do(func(d *apd.Decimal) (apd.Condition, error) { return exact.Add(d, x, y) })
}

func (c *calc) sub(x, y *apd.Decimal) apd.Decimal {
	return c.do(func(d *apd.Decimal) (apd.Condition, error) { return exact.Sub(d, x, y) })
}

// ceilQuo is ⌈x / y⌉ for x ≥ 0 and y > 0: the integer quotient, plus one
// when a remainder is left.
func (c *calc) ceilQuo(x, y *apd.Decimal) apd.Decimal {
	quo := c.do(func(d *apd.Decimal) (apd.Condition, error) { return exact.QuoInteger(d, x, y) })
	rem := c.do(func(d *apd.Decimal) (apd.Condition, error) { return exact.Rem(d, x, y) })
	if rem.IsZero() {
		return quo
	}
	return c.add(&quo, apd.New(1, 0))
}

// tier is one TierLine: q units at t's unit amount plus its flat amount.
func (c *calc) tier(i int, t Tier, q *apd.Decimal) TierLine {
	units := c.mul(q, &t.UnitAmount)
	return TierLine{Tier: i, Quantity: *q, UnitAmount: reduced(&t.UnitAmount), FlatAmount: reduced(&t.FlatAmount),
		Amount: c.add(&units, &t.FlatAmount)}
}

// graduated prices each part of q > 0 in the tier it falls in: tier i
// holds the units above the previous bound (0 for the first) up to its
// own; every tier q reaches (q above its lower bound) adds its flat amount.
func (c *calc) graduated(q *apd.Decimal, tiers []Tier) []TierLine {
	var (
		lines []TierLine
		lower apd.Decimal // zero
	)
	for i, t := range tiers {
		if q.Cmp(&lower) <= 0 {
			break
		}
		top := q
		if t.UpTo != nil && t.UpTo.Cmp(q) < 0 {
			top = t.UpTo
		}
		in := c.sub(top, &lower)
		lines = append(lines, c.tier(i, t, &in))
		if t.UpTo == nil {
			break
		}
		lower = *t.UpTo
	}
	return lines
}

// volume prices all of q > 0 in the first tier whose bound it does not
// exceed (the last tier has none).
func (c *calc) volume(q *apd.Decimal, tiers []Tier) []TierLine {
	for i, t := range tiers {
		if t.UpTo == nil || q.Cmp(t.UpTo) <= 0 {
			return []TierLine{c.tier(i, t, q)}
		}
	}
	return nil // unreachable: the last tier is open-ended
}

func (c *calc) sumTiers(lines []TierLine) apd.Decimal {
	var sum apd.Decimal
	for _, l := range lines {
		sum = c.add(&sum, &l.Amount)
	}
	return sum
}

// MarshalJSON writes li with its decimals as strings in plain notation:
// {"model","quantity","tiers","packages","subtotal","minimum_applied",
// "exact","amount"}, "tiers" left out when nil and "packages" for other
// models than package.
func (li LineItem) MarshalJSON() ([]byte, error) {
	w := struct {
		Model          Model      `json:"model"`
		Quantity       string     `json:"quantity"`
		Tiers          []TierLine `json:"tiers,omitempty"`
		Packages       string     `json:"packages,omitempty"`
		Subtotal       string     `json:"subtotal"`
		MinimumApplied bool       `json:"minimum_applied"`
		Exact          string     `json:"exact"`
		Amount         int64      `json:"amount"`
	}{li.Model, Text(&li.Quantity), li.Tiers, "", Text(&li.Subtotal), li.MinimumApplied, Text(&li.Exact), li.Amount}
	if li.Model == ModelPackage {
		w.Packages = Text(&li.Packages)
	}
	return json.Marshal(w)
}

// MarshalJSON writes t with its decimals as strings in plain notation:
// {"tier","quantity","unit_amount","flat_amount","amount"}.
func (t TierLine) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Tier       int    `json:"tier"`
		Quantity   string `json:"quantity"`
		UnitAmount string `json:"unit_amount"`
		FlatAmount string `json:"flat_amount"`
		Amount     string `json:"amount"`
	}{t.Tier, Text(&t.Quantity), Text(&t.UnitAmount), Text(&t.FlatAmount), Text(&t.Amount)})
}
