package stripeapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestClassify(t *testing.T) {
	t.Parallel()

	pi := func(status stripe.PaymentIntentStatus) *stripe.PaymentIntent {
		return &stripe.PaymentIntent{ID: "pi_1", Status: status, LatestCharge: &stripe.Charge{ID: "ch_1"}}
	}
	stripeErr := func(status int, typ stripe.ErrorType, code stripe.ErrorCode) error {
		// Wrapped, as callers may wrap it; classify must unwrap.
		return fmt.Errorf("calling stripe: %w", &stripe.Error{HTTPStatusCode: status, Type: typ, Code: code, Msg: "msg", RequestID: "req_1"})
	}
	paramErr := func(code stripe.ErrorCode, param string) error {
		return &stripe.Error{HTTPStatusCode: 400, Type: stripe.ErrorTypeInvalidRequest, Code: code, Param: param, Msg: "msg"}
	}

	tests := []struct {
		name  string
		pi    *stripe.PaymentIntent
		err   error
		class ledger.OutcomeClass
		code  string
	}{
		{"Succeeded", pi(stripe.PaymentIntentStatusSucceeded), nil, ledger.OutcomeSucceeded, ""},
		{"Processing", pi(stripe.PaymentIntentStatusProcessing), nil, ledger.OutcomeProcessing, ""},
		{"RequiresAction", pi(stripe.PaymentIntentStatusRequiresAction), nil, ledger.OutcomeFailed, "requires_action"},
		{"RequiresPaymentMethod", pi(stripe.PaymentIntentStatusRequiresPaymentMethod), nil, ledger.OutcomeFailed, "requires_payment_method"},
		{"Canceled", pi(stripe.PaymentIntentStatusCanceled), nil, ledger.OutcomeFailed, "canceled"},
		{"RequiresCaptureIsHeld", pi(stripe.PaymentIntentStatusRequiresCapture), nil, ledger.OutcomeHeld, "requires_capture"},
		{"CardDeclined", nil, stripeErr(402, stripe.ErrorTypeCard, stripe.ErrorCodeCardDeclined), ledger.OutcomeFailed, "card_declined"},
		{"AuthenticationRequired", nil, stripeErr(402, stripe.ErrorTypeCard, stripe.ErrorCodeAuthenticationRequired), ledger.OutcomeFailed, "authentication_required"},
		{"InvalidRequest", nil, stripeErr(400, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeParameterInvalidInteger), ledger.OutcomeFailed, "parameter_invalid_integer"},
		{"ResourceMissing", nil, stripeErr(404, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeResourceMissing), ledger.OutcomeFailed, "resource_missing"},
		{"NoPaymentMethod", nil, paramErr(stripe.ErrorCodePaymentIntentUnexpectedState, "payment_method"), ledger.OutcomeFailed, ledger.FailureNoPaymentMethod},
		{"PaymentMethodGone", nil, paramErr(stripe.ErrorCodeResourceMissing, "payment_method"), ledger.OutcomeFailed, ledger.FailureNoPaymentMethod},
		{"CustomerMissing", nil, paramErr(stripe.ErrorCodeResourceMissing, "customer"), ledger.OutcomeFailed, "resource_missing"},
		{"IdempotencyError", nil, stripeErr(400, stripe.ErrorTypeIdempotency, ""), ledger.OutcomeHeld, ""},
		{"KeyInUse", nil, stripeErr(409, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeIdempotencyKeyInUse), ledger.OutcomeRetryLater, "idempotency_key_in_use"},
		{"RateLimited", nil, stripeErr(429, "rate_limit_error", stripe.ErrorCodeRateLimit), ledger.OutcomeRetryLater, "rate_limit"},
		{"ServerError", nil, stripeErr(500, stripe.ErrorTypeAPI, ""), ledger.OutcomeUnknown, ""},
		{"BadGateway", nil, stripeErr(502, "", ""), ledger.OutcomeUnknown, ""},
		{"Unauthorized", nil, stripeErr(401, stripe.ErrorTypeInvalidRequest, ""), ledger.OutcomeError, ""},
		{"Forbidden", nil, stripeErr(403, stripe.ErrorTypeInvalidRequest, ""), ledger.OutcomeError, ""},
		{"Timeout", nil, &url.Error{Op: "Post", URL: "https://api.stripe.com", Err: context.DeadlineExceeded}, ledger.OutcomeUnknown, ""},
		{"ConnectionDropped", nil, &url.Error{Op: "Post", URL: "https://api.stripe.com", Err: io.EOF}, ledger.OutcomeUnknown, ""},
		{"Canceled context", nil, context.Canceled, ledger.OutcomeUnknown, ""},
		{"OtherError", nil, errors.New("boom"), ledger.OutcomeUnknown, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := Classify(tt.pi, tt.err)
			require.Equal(t, tt.class, o.Class)
			require.Equal(t, tt.code, o.ErrorCode)
			if tt.pi != nil {
				require.Equal(t, "pi_1", o.StripePaymentIntentID)
			}
		})
	}
}

func TestPaymentIntentParams(t *testing.T) {
	t.Parallel()

	pm := "pm_1"
	c := &ledger.Charge{ID: 7, CustomerID: "acme", Period: "2026-11", AmountCents: 1234, Currency: "eur",
		StripeCustomerID: "cus_1", StripePaymentMethodID: &pm, ChargeKey: ledger.ChargeKey("", "acme", "2026-11"),
		IdempotencyKey: ledger.ChargeIdempotencyKey("", "acme", "2026-11", 0)}
	a, b := PaymentIntentParams(c), PaymentIntentParams(c)
	require.Equal(t, a, b, "a pure function of the charge row")
	require.Equal(t, int64(1234), *a.Amount)
	require.True(t, *a.Confirm)
	require.True(t, *a.OffSession)
	require.Equal(t, "pm_1", *a.PaymentMethod)
	require.Equal(t, c.IdempotencyKey, *a.IdempotencyKey)
	require.Equal(t, "7", a.Metadata["charge_id"])
	require.Equal(t, c.ChargeKey, a.Metadata["tally_charge_key"])
}
