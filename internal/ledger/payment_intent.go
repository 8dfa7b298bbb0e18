package ledger

import (
	"fmt"
	"strings"
)

// PaymentIntentFacts is what Stripe says a PaymentIntent carrying a charge's
// key is for: the one check that both settlement paths (webhooks, and the
// look-ups and reconciliation that list Stripe) apply before a PaymentIntent
// may be recorded as a charge's outcome.
type PaymentIntentFacts struct {
	ID        string
	Customer  string // the Stripe customer
	Amount    int64
	Currency  string
	Livemode  bool
	ChargeKey string // metadata.tally_charge_key
	Namespace string // metadata.tally_namespace ("" for a v1 charge's)
}

// PaymentIntentMismatch says why the PaymentIntent f cannot be charge c's
// outcome, or "" when it can: it must carry c's key and namespace and be for
// c's Stripe customer, amount and currency, in the mode (live or test) of the
// Stripe key Tally uses (livemode).
func (c *Charge) PaymentIntentMismatch(f PaymentIntentFacts, livemode bool) string {
	var why []string
	if f.ChargeKey != c.ChargeKey {
		why = append(why, fmt.Sprintf("tally_charge_key %q, not %q", f.ChargeKey, c.ChargeKey))
	}
	if f.Namespace != c.KeyNamespace {
		why = append(why, fmt.Sprintf("namespace %q, not %q", f.Namespace, c.KeyNamespace))
	}
	if f.Customer != c.StripeCustomerID {
		why = append(why, fmt.Sprintf("customer %q, not %q", f.Customer, c.StripeCustomerID))
	}
	if f.Amount != c.AmountCents || f.Currency != c.Currency {
		why = append(why, fmt.Sprintf("%d %s, not %d %s", f.Amount, f.Currency, c.AmountCents, c.Currency))
	}
	if f.Livemode != livemode {
		why = append(why, fmt.Sprintf("livemode %t, not %t", f.Livemode, livemode))
	}
	if len(why) == 0 {
		return ""
	}
	return fmt.Sprintf("PaymentIntent %s carries the charge's key but differs: %s", f.ID, strings.Join(why, "; "))
}
