package stripesim

import (
	"net/http"
	"strings"

	"github.com/stripe/stripe-go/v76"
)

// PaymentMethodDefault is the default payment method of every simulated customer until
// CustomerSetDefaultPaymentMethod changes it. It is Stripe's test-mode Visa payment method.
const PaymentMethodDefault = "pm_card_visa"

// customer is a simulated Stripe customer. Any id starting with "cus_" exists implicitly; a
// record is made the first time the id is seen.
type customer struct {
	id                   string
	created              int64
	defaultPaymentMethod string // "" means none
}

type customerInvoiceSettingsWire struct {
	CustomFields         any     `json:"custom_fields"`
	DefaultPaymentMethod *string `json:"default_payment_method"`
	Footer               *string `json:"footer"`
	RenderingOptions     any     `json:"rendering_options"`
}

type customerWire struct {
	ID               string                      `json:"id"`
	Object           string                      `json:"object"`
	Balance          int64                       `json:"balance"`
	Created          int64                       `json:"created"`
	Currency         *string                     `json:"currency"`
	DefaultSource    *string                     `json:"default_source"`
	Delinquent       bool                        `json:"delinquent"`
	Description      *string                     `json:"description"`
	Email            *string                     `json:"email"`
	InvoicePrefix    string                      `json:"invoice_prefix"`
	InvoiceSettings  customerInvoiceSettingsWire `json:"invoice_settings"`
	Livemode         bool                        `json:"livemode"`
	Metadata         map[string]string           `json:"metadata"`
	Name             *string                     `json:"name"`
	Phone            *string                     `json:"phone"`
	PreferredLocales []string                    `json:"preferred_locales"`
	Shipping         any                         `json:"shipping"`
	TaxExempt        string                      `json:"tax_exempt"`
}

func (c *customer) wire() customerWire {
	return customerWire{
		ID:      c.id,
		Object:  "customer",
		Created: c.created,
		// Stable, Stripe-like prefix derived from the id.
		InvoicePrefix: strings.ToUpper(strings.TrimPrefix(c.id, "cus_")[:min(8, len(c.id)-len("cus_"))]),
		InvoiceSettings: customerInvoiceSettingsWire{
			DefaultPaymentMethod: stringOrNil(c.defaultPaymentMethod),
		},
		Metadata:         map[string]string{},
		PreferredLocales: []string{},
		TaxExempt:        "none",
	}
}

// customerIDValid reports whether id names a simulated customer.
func customerIDValid(id string) bool {
	return strings.HasPrefix(id, "cus_") && len(id) > len("cus_")
}

// customerGetLocked returns the customer with the id, creating its record on first sight, or
// nil if the id does not name a simulated customer. s.mu must be held.
func (s *Server) customerGetLocked(id string) *customer {
	if !customerIDValid(id) {
		return nil
	}
	c, ok := s.customers[id]
	if !ok {
		c = &customer{id: id, created: s.nowLocked().Unix(), defaultPaymentMethod: PaymentMethodDefault}
		s.customers[id] = c
	}
	return c
}

// CustomerSetDefaultPaymentMethod sets the customer's invoice_settings.default_payment_method
// to paymentMethodID, or to none when paymentMethodID is empty, and returns the customer. It
// returns an error wrapping ErrNotFound if customerID does not start with "cus_", and one
// wrapping ErrInvalid if paymentMethodID is not a payment method id.
func (s *Server) CustomerSetDefaultPaymentMethod(customerID, paymentMethodID string) (*stripe.Customer, error) {
	return decodeAs[stripe.Customer](s.customerSetDefaultPaymentMethod(customerID, paymentMethodID))
}

func (s *Server) customerSetDefaultPaymentMethod(customerID, paymentMethodID string) ([]byte, error) {
	if paymentMethodID != "" && !paymentMethodIDValid(paymentMethodID) {
		return nil, errorf(ErrInvalid, "not a payment method id: %q", paymentMethodID)
	}
	s.mu.Lock()
	c := s.customerGetLocked(customerID)
	if c == nil {
		s.mu.Unlock()
		return nil, errorf(ErrNotFound, "no such customer: %q", customerID)
	}
	c.defaultPaymentMethod = paymentMethodID
	body := mustJSON(c.wire())
	s.mu.Unlock()
	s.logger.Info("customer default payment method set", "customer", customerID, "payment_method", paymentMethodID)
	return body, nil
}

func (s *Server) handleCustomerRetrieve(w http.ResponseWriter, r *http.Request, rs *requestState) {
	s.latencyApply(r.Context(), "")
	id := r.PathValue("id")
	s.mu.Lock()
	c := s.customerGetLocked(id)
	var wire customerWire
	if c != nil {
		wire = c.wire()
	}
	s.mu.Unlock()
	if c == nil {
		s.writeError(w, rs, errResourceMissing("id", "customer", id))
		return
	}
	s.writeJSON(w, http.StatusOK, wire)
}
