// Package pricing holds Tally's price books and the rating of quantities
// into money: what a plan is, how it is decoded and encoded, and how a
// period's quantity of a metric becomes a line item. It is pure: no
// database, no HTTP, no clock. The ledger stores plan versions and rates
// at close with it; the API decodes plans and shows line items with it.
//
// # Plans
//
// A Plan is one version of a price book: a currency and a price per metric.
// Every amount is in the currency's minor unit (cents for usd) and may have
// a fraction, such as "0.025". A price has one of four models:
//
//   - per_unit: quantity × unit_amount.
//     {"model":"per_unit","unit_amount":"0.025"}
//   - graduated: tiers, each with an inclusive up_to (the last open-ended,
//     null), a unit_amount and an optional flat_amount. Each unit is priced
//     in the tier it falls in; a tier's flat amount is added once when the
//     quantity reaches the tier (is above the previous tier's up_to, or
//     above zero for the first).
//     {"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1","flat_amount":"0"}]}
//   - volume: the same tiers, but the whole quantity is priced at the unit
//     amount of the first tier whose up_to is at least the quantity, plus
//     that tier's flat amount.
//   - package: unit_amount per started package of package_size units,
//     ⌈quantity / package_size⌉ × unit_amount.
//     {"model":"package","package_size":"100","unit_amount":"250"}
//
// Any price may carry a minimum_amount: in a period with usage (a quantity
// above zero) the line comes to at least that much.
//
// ParsePlan decodes a plan strictly and names each bad field by its path,
// the rule and what to send instead, such as
// "prices.api_calls.tiers[1].up_to: must be greater than the previous
// tier's up_to (1000)". Plan.MarshalJSON is the canonical encoding: equal
// content gives equal bytes, so a version can be hashed and a PUT of the
// same content recognised as a replay.
//
// # Rating and rounding
//
// Rate(price, quantity) gives a LineItem: the quantity, the tier breakdown
// (graduated and volume) or packages started (package), the exact amount,
// and Amount, an int64 of minor units. Arithmetic is exact; there is one
// rounding, of each line item's exact amount (after the minimum), half-up
// to a whole minor unit. A charge is the sum of its line items' Amounts;
// a line is never re-rounded and tier amounts are never rounded on their
// own. Quantities are exact decimals with at most 12 digits after the
// point (ParseQuantity reads them as events send them). A zero quantity
// rates to zero in every model (no tier reached, no package started, no
// minimum); a negative one is refused, since voids lower a period's
// quantity but never below zero.
//
// For example, under the graduated price above, 1500 units come to
// 1000 × 0.5 + 500 × 0.1 = 550 minor units, and 1000.5 units to
// 500 + 0.05 = 500.05, which rounds to 500.
//
// # Decimals
//
// Amounts and quantities are github.com/cockroachdb/apd/v3 Decimals; no
// float64 touches them. apd was chosen over shopspring/decimal because every
// apd operation runs in an explicit Context: this package's traps Inexact,
// so any step that would have to round fails instead of rounding silently,
// and the one rounding names its mode (RoundHalfUp). shopspring/decimal
// rounds division to a package-wide DivisionPrecision and has other
// package-wide settings that any importer could change. Decimals are
// treated as values: the package never modifies one it was given or
// returned.
package pricing
