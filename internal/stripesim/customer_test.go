package stripesim

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
)

func TestCustomer(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	t.Run("DefaultPaymentMethodChanged", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		c, err := bundle.sim.CustomerSetDefaultPaymentMethod("cus_a", "pm_card_mastercard")
		require.NoError(t, err)
		require.Equal(t, "pm_card_mastercard", c.InvoiceSettings.DefaultPaymentMethod.ID)

		got, err := bundle.api.Customers.Get("cus_a", nil)
		require.NoError(t, err)
		require.Equal(t, "pm_card_mastercard", got.InvoiceSettings.DefaultPaymentMethod.ID)

		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, "pm_card_mastercard", pi.PaymentMethod.ID)
	})

	t.Run("DefaultPaymentMethodNone", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		_, err := bundle.sim.CustomerSetDefaultPaymentMethod("cus_a", "")
		require.NoError(t, err)
		got, err := bundle.api.Customers.Get("cus_a", nil)
		require.NoError(t, err)
		require.Nil(t, got.InvoiceSettings.DefaultPaymentMethod)

		_, err = bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		stripeErr := requireStripeError(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodePaymentIntentUnexpectedState)
		require.Equal(t, "payment_method", stripeErr.Param)
		require.Empty(t, bundle.sim.PaymentIntentList())

		// Not stored: once the customer has a payment method the same key executes.
		_, err = bundle.sim.CustomerSetDefaultPaymentMethod("cus_a", "pm_card_visa")
		require.NoError(t, err)
		pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, "cus_a", 700, "k1"))
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		_, err := bundle.sim.CustomerSetDefaultPaymentMethod("acct_1", "pm_card_visa")
		require.ErrorIs(t, err, ErrNotFound)
		_, err = bundle.sim.CustomerSetDefaultPaymentMethod("cus_a", "visa")
		require.ErrorIs(t, err, ErrInvalid)
	})

	t.Run("Retrieve", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		c, err := bundle.api.Customers.Get("cus_a", nil)
		require.NoError(t, err)
		require.Equal(t, "cus_a", c.ID)
		require.Equal(t, "customer", c.Object)
		require.False(t, c.Livemode)
		require.NotNil(t, c.InvoiceSettings)
		require.NotNil(t, c.InvoiceSettings.DefaultPaymentMethod)
		require.Equal(t, PaymentMethodDefault, c.InvoiceSettings.DefaultPaymentMethod.ID)
		require.True(t, len(c.LastResponse.RequestID) > len("req_"))
	})

	t.Run("RetrieveMissing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		for _, id := range []string{"acct_1", "cus_", "customer_1"} {
			_, err := bundle.api.Customers.Get(id, nil)
			stripeErr := requireStripeError(t, err, http.StatusNotFound, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeResourceMissing)
			require.Contains(t, stripeErr.Msg, "No such customer")
		}
	})
}
