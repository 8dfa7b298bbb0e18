package api

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
)

// customerResponse is a customer as the API shows it.
type customerResponse struct {
	CustomerID            string    `json:"customer_id"`
	StripeCustomerID      string    `json:"stripe_customer_id"`
	StripePaymentMethodID *string   `json:"stripe_payment_method_id"`
	Currency              string    `json:"currency"`
	MaxChargeCents        *int64    `json:"max_charge_cents"`
	UsageAlertThresholds  []int64   `json:"usage_alert_thresholds_cents"`
	PlanID                *string   `json:"plan_id"`
	RechargeBelowCents    *int64    `json:"recharge_below_cents"`
	RechargeToCents       *int64    `json:"recharge_to_cents"`
	CreatedAt             time.Time `json:"created_at"`
	UpdatedAt             time.Time `json:"updated_at"`

	// CarriedForwardCents, on GET, is per currency what the customer's
	// charges below Stripe's minimum carry and no later charge bills yet.
	CarriedForwardCents map[string]int64 `json:"carried_forward_cents,omitempty"`
}

func newCustomerResponse(c *ledger.Customer) customerResponse {
	thresholds := c.UsageAlertThresholdsCents
	if thresholds == nil {
		thresholds = []int64{}
	}
	return customerResponse{
		CustomerID: c.ID, StripeCustomerID: c.StripeCustomerID, StripePaymentMethodID: c.StripePaymentMethodID,
		Currency: c.Currency, MaxChargeCents: c.MaxChargeCents, UsageAlertThresholds: thresholds, PlanID: c.PlanID,
		RechargeBelowCents: c.RechargeBelowCents, RechargeToCents: c.RechargeToCents, CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt, CarriedForwardCents: c.CarriedForwardCents,
	}
}

// handleCustomerPut creates or replaces a customer: 201 when created, 200
// when updated.
func handleCustomerPut(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type request struct {
		StripeCustomerID      string  `json:"stripe_customer_id"`
		StripePaymentMethodID *string `json:"stripe_payment_method_id"`
		Currency              string  `json:"currency"`
		MaxChargeCents        *int64  `json:"max_charge_cents"`
		UsageAlertThresholds  []int64 `json:"usage_alert_thresholds_cents"`
		PlanID                *string `json:"plan_id"`
		RechargeBelowCents    *int64  `json:"recharge_below_cents"`
		RechargeToCents       *int64  `json:"recharge_to_cents"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		c, created, err := l.CustomerPut(r.Context(), ledger.CustomerPutParams{
			ID: r.PathValue("customer_id"), StripeCustomerID: req.StripeCustomerID,
			StripePaymentMethodID: req.StripePaymentMethodID, Currency: req.Currency, MaxChargeCents: req.MaxChargeCents,
			UsageAlertThresholdsCents: req.UsageAlertThresholds, PlanID: req.PlanID,
			RechargeBelowCents: req.RechargeBelowCents, RechargeToCents: req.RechargeToCents,
		})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, createdOrOK(created), newCustomerResponse(c))
	})
}

// handleCustomerGet returns a customer, or 404.
func handleCustomerGet(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := l.CustomerGet(r.Context(), r.PathValue("customer_id"))
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusOK, newCustomerResponse(c))
	})
}
