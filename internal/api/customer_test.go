package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// customerBody is a customer as the API answers it.
type customerBody struct {
	CustomerID            string    `json:"customer_id"`
	StripeCustomerID      string    `json:"stripe_customer_id"`
	StripePaymentMethodID *string   `json:"stripe_payment_method_id"`
	Currency              string    `json:"currency"`
	MaxChargeCents        *int64    `json:"max_charge_cents"`
	UsageAlertThresholds  []int64   `json:"usage_alert_thresholds_cents"`
	PlanID                *string   `json:"plan_id"`
	CreatedAt             time.Time `json:"created_at"`
	UpdatedAt             time.Time `json:"updated_at"`
}

func TestCustomerPut(t *testing.T) {
	t.Parallel()

	t.Run("BadFields", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodPut, "/v1/customers/globex",
			`{"stripe_customer_id":"","stripe_payment_method_id":"pm\u0001","currency":"dollars","max_charge_cents":0}`)
		p := requireInvalid(t, b.requireNothingWritten(t, req), "stripe_customer_id")
		require.Len(t, p.Errors, 4, "errors: %v", p.Errors)
		for _, field := range []string{"currency", "max_charge_cents", "stripe_payment_method_id"} {
			require.NotEmpty(t, p.Errors[field], field)
		}
	})

	t.Run("BadFieldsLeaveExistingCustomerAlone", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		before := b.do(http.MethodGet, "/v1/customers/acme", "").Body.String()
		req := b.newRequest(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_new","currency":"euros"}`)
		requireInvalid(t, b.requireNothingWritten(t, req), "currency")
		require.Equal(t, before, b.do(http.MethodGet, "/v1/customers/acme", "").Body.String())
	})

	t.Run("Creates", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.do(http.MethodPut, "/v1/customers/globex",
			`{"stripe_customer_id":"cus_globex","stripe_payment_method_id":"pm_1","currency":"EUR","max_charge_cents":50000}`)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		c := decodeJSON[customerBody](t, rec)
		require.Equal(t, "globex", c.CustomerID)
		require.Equal(t, "cus_globex", c.StripeCustomerID)
		require.Equal(t, "pm_1", *c.StripePaymentMethodID)
		require.Equal(t, "eur", c.Currency)
		require.Equal(t, int64(50000), *c.MaxChargeCents)
		require.Equal(t, []int64{}, c.UsageAlertThresholds)
		require.True(t, c.CreatedAt.Equal(ledgertest.ClockStart))
		require.True(t, c.UpdatedAt.Equal(ledgertest.ClockStart))
		require.Equal(t, int64(1), b.Count(t, "SELECT count(*) FROM billing.customers WHERE customer_id = 'globex'"))
	})

	t.Run("CustomerIDTooLong", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodPut, "/v1/customers/"+strings.Repeat("c", 256), `{"stripe_customer_id":"cus_1","currency":"usd"}`)
		requireInvalid(t, b.requireNothingWritten(t, req), "customer_id")
	})

	t.Run("CustomerIDWithControlCharacter", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodPut, "/v1/customers/a%01b", `{"stripe_customer_id":"cus_1","currency":"usd"}`)
		requireInvalid(t, b.requireNothingWritten(t, req), "customer_id")
	})

	t.Run("MalformedJSON", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, body := range []string{
			`{"stripe_customer_id":"cus_1",`,
			`{"stripe_customer_id":"cus_1","currency":"usd"} {}`,
			`not json`,
		} {
			req := b.newRequest(http.MethodPut, "/v1/customers/globex", body)
			requireProblem(t, b.requireNothingWritten(t, req), http.StatusBadRequest, "malformed_json")
		}
	})

	t.Run("UnknownField", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodPut, "/v1/customers/globex", `{"stripe_customer_id":"cus_1","currency":"usd","email":"a@b.c"}`)
		p := requireInvalid(t, b.requireNothingWritten(t, req), "email")
		require.Len(t, p.Errors, 1)
	})

	t.Run("UnsupportedMediaType", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded"} {
			req := b.newRequest(http.MethodPut, "/v1/customers/globex", `{"stripe_customer_id":"cus_1","currency":"usd"}`)
			req.Header.Set("Content-Type", ct)
			requireProblem(t, b.requireNothingWritten(t, req), http.StatusUnsupportedMediaType, "unsupported_media_type")
		}
	})

	t.Run("Plan", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		p := requireInvalid(t, b.do(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd","plan_id":"std"}`), "plan_id")
		require.Contains(t, p.Errors["plan_id"], `unknown plan "std": create it with PUT /v1/plans/{plan_id} first`)
		b.Plan(t, "std", planPerUnit)
		b.Plan(t, "euro", `{"currency":"eur","prices":{}}`)
		p = requireInvalid(t, b.do(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd","plan_id":"euro"}`), "plan_id")
		require.Contains(t, p.Errors["plan_id"], `plan "euro" is in eur, and the customer in usd`)

		rec := b.do(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd","plan_id":"std"}`)
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Equal(t, "std", *decodeJSON[customerBody](t, rec).PlanID)
		require.Equal(t, "std", *decodeJSON[customerBody](t, b.do(http.MethodGet, "/v1/customers/acme", "")).PlanID)

		// The period that opens now is priced with version 1, and says so.
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("e1", 100)).Code)
		b.Plan(t, "std", planTiered)
		period := decodeJSON[periodBody](t, b.do(http.MethodGet, "/v1/customers/acme/periods/2026-11", ""))
		require.Equal(t, "std", *period.PlanID)
		require.Equal(t, int32(1), *period.PlanVersion)

		// Omitted, the customer is on no plan.
		rec = b.do(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd"}`)
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Nil(t, decodeJSON[customerBody](t, rec).PlanID)
	})

	t.Run("Updates", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		b.Clock.Advance(time.Hour)
		rec := b.do(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_other","currency":"gbp","max_charge_cents":100}`)
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		c := decodeJSON[customerBody](t, rec)
		require.Equal(t, "cus_other", c.StripeCustomerID)
		require.Equal(t, "gbp", c.Currency)
		require.Equal(t, int64(100), *c.MaxChargeCents)
		require.Nil(t, c.StripePaymentMethodID)
		require.True(t, c.CreatedAt.Equal(ledgertest.ClockStart))
		require.True(t, c.UpdatedAt.Equal(ledgertest.ClockStart.Add(time.Hour)))
		require.Equal(t, int64(1), b.Count(t, "SELECT count(*) FROM billing.customers"))
	})

	t.Run("UsageAlertThresholds", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.do(http.MethodPut, "/v1/customers/acme",
			`{"stripe_customer_id":"cus_acme","currency":"usd","usage_alert_thresholds_cents":[50000,10000,50000]}`)
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Equal(t, []int64{10000, 50000}, decodeJSON[customerBody](t, rec).UsageAlertThresholds, "ascending, without repeats")
		req := b.newRequest(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd","usage_alert_thresholds_cents":[0]}`)
		p := requireInvalid(t, b.serve(req), "usage_alert_thresholds_cents")
		require.Contains(t, p.Errors["usage_alert_thresholds_cents"], "between 1 and")
	})

	t.Run("WrongType", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for field, body := range map[string]string{
			"currency":         `{"stripe_customer_id":"cus_1","currency":840}`,
			"max_charge_cents": `{"stripe_customer_id":"cus_1","currency":"usd","max_charge_cents":"100"}`,
		} {
			req := b.newRequest(http.MethodPut, "/v1/customers/globex", body)
			requireInvalid(t, b.requireNothingWritten(t, req), field)
		}
	})
}

func TestCustomerGet(t *testing.T) {
	t.Parallel()

	t.Run("Found", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.do(http.MethodGet, "/v1/customers/acme", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		c := decodeJSON[customerBody](t, rec)
		require.Equal(t, "acme", c.CustomerID)
		require.Equal(t, "cus_acme", c.StripeCustomerID)
		require.Equal(t, "usd", c.Currency)
		require.Nil(t, c.MaxChargeCents)
	})

	t.Run("IDNotValidText", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, path := range []string{"/v1/customers/a%00b", "/v1/customers/a%FFb", "/v1/customers/a%00b/periods", "/v1/customers/a%00b/periods/2026-11"} {
			rec := b.do(http.MethodGet, path, "")
			require.Contains(t, []int{http.StatusNotFound, http.StatusUnprocessableEntity}, rec.Code, "%s: %s", path, rec.Body)
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		p := requireProblem(t, b.do(http.MethodGet, "/v1/customers/ghost", ""), http.StatusNotFound, "not_found")
		require.Contains(t, p.Detail, "ghost")
	})
}
