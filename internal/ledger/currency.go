package ledger

// Stripe's limits on a PaymentIntent's amount, in the currency's minor units
// (https://docs.stripe.com/currencies#minimum-and-maximum-charge-amounts): the
// one table both Tally and its Stripe simulator follow.

// AmountMaxCents is the largest amount Stripe accepts for one PaymentIntent
// (eight digits); a charge above it is held amount_too_large.
const AmountMaxCents int64 = 99_999_999

// amountMinDefault is the minimum for a currency missing from amountMin: the
// smallest in the table, so a charge is never carried forward by mistake
// (Stripe then refuses it, and the charge fails visibly).
const amountMinDefault int64 = 50

// amountMin is Stripe's minimum charge amount per settlement currency, in
// minor units (zero-decimal currencies such as jpy count whole units).
var amountMin = map[string]int64{
	"usd": 50, "aed": 200, "aud": 50, "bgn": 100, "brl": 50, "cad": 50, "chf": 50, "czk": 1500,
	"dkk": 250, "eur": 50, "gbp": 30, "hkd": 400, "huf": 17500, "inr": 50, "jpy": 50, "mxn": 1000,
	"myr": 200, "nok": 300, "nzd": 50, "pln": 200, "ron": 200, "sek": 300, "sgd": 50, "thb": 1000,
}

// AmountMinCents returns Stripe's minimum charge amount for currency, in its
// minor units. A charge below it is carried forward to the customer's next
// charge instead of being sent.
func AmountMinCents(currency string) int64 {
	if m, ok := amountMin[currency]; ok {
		return m
	}
	return amountMinDefault
}
