package stripesim

import "strings"

type paymentMethodCardWire struct {
	Brand    string `json:"brand"`
	Country  string `json:"country"`
	ExpMonth int    `json:"exp_month"`
	ExpYear  int    `json:"exp_year"`
	Funding  string `json:"funding"`
	Last4    string `json:"last4"`
}

// paymentMethodWire is the small PaymentMethod object embedded in card errors.
type paymentMethodWire struct {
	ID       string                 `json:"id"`
	Object   string                 `json:"object"`
	Card     *paymentMethodCardWire `json:"card"`
	Created  int64                  `json:"created"`
	Customer *string                `json:"customer"`
	Livemode bool                   `json:"livemode"`
	Metadata map[string]string      `json:"metadata"`
	Type     string                 `json:"type"`
}

// paymentMethodIDValid reports whether id looks like a payment method (or legacy card/source)
// id.
func paymentMethodIDValid(id string) bool {
	for _, p := range []string{"pm_", "card_", "src_"} {
		if strings.HasPrefix(id, p) && len(id) > len(p) {
			return true
		}
	}
	return false
}

func paymentMethodNew(id, customerID string, created int64) *paymentMethodWire {
	brand, last4 := "visa", "4242"
	switch {
	case strings.Contains(id, "mastercard"):
		brand, last4 = "mastercard", "4444"
	case strings.Contains(id, "amex"):
		brand, last4 = "amex", "8431"
	}
	return &paymentMethodWire{
		ID:     id,
		Object: "payment_method",
		Card: &paymentMethodCardWire{
			Brand: brand, Country: "US", ExpMonth: 12, ExpYear: 2034, Funding: "credit", Last4: last4,
		},
		Created:  created,
		Customer: stringOrNil(customerID),
		Metadata: map[string]string{},
		Type:     "card",
	}
}
