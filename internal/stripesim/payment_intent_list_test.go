package stripesim

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
)

func TestPaymentIntentList(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	// setupMany creates 250 PaymentIntents for cus_page in one second, 5 for cus_other, then 20
	// more for cus_page ten seconds later, and returns cus_page's ids in creation order.
	setupMany := func(t *testing.T) (*testBundle, []string) {
		t.Helper()
		bundle := setup(t, &testSetupOpts{
			config:     Config{Now: func() time.Time { return testBaseTime }},
			httpClient: &http.Client{Timeout: time.Minute}, // keep-alive: hundreds of requests
		})
		var ids []string
		create := func(customerID string, n int) {
			for i := range n {
				pi, err := bundle.api.PaymentIntents.New(chargeParams(ctx, customerID, int64(100+i), fmt.Sprintf("%s-%d-%d", customerID, len(ids), i)))
				require.NoError(t, err)
				if customerID == "cus_page" {
					ids = append(ids, pi.ID)
				}
			}
		}
		create("cus_page", 250)
		create("cus_other", 5)
		_, err := bundle.sim.ClockAdvance(10 * time.Second)
		require.NoError(t, err)
		create("cus_page", 20)
		return bundle, ids
	}

	collect := func(t *testing.T, iter interface {
		Next() bool
		Err() error
		PaymentIntent() *stripe.PaymentIntent
	}) []string {
		t.Helper()
		var ids []string
		for iter.Next() {
			ids = append(ids, iter.PaymentIntent().ID)
		}
		require.NoError(t, iter.Err())
		return ids
	}

	t.Run("CreatedFilter", func(t *testing.T) {
		t.Parallel()
		bundle, ids := setupMany(t)

		later := testBaseTime.Unix() + 10
		got := collect(t, bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{
			Customer:     stripe.String("cus_page"),
			CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: later},
		}))
		want := slices.Clone(ids[250:])
		slices.Reverse(want)
		require.Equal(t, want, got)

		got = collect(t, bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{
			Customer:     stripe.String("cus_page"),
			CreatedRange: &stripe.RangeQueryParams{LesserThan: later},
			ListParams:   stripe.ListParams{Limit: stripe.Int64(100)},
		}))
		require.Len(t, got, 250)

		got = collect(t, bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{
			Customer:     stripe.String("cus_page"),
			CreatedRange: &stripe.RangeQueryParams{GreaterThan: later},
		}))
		require.Empty(t, got)

		got = collect(t, bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{
			Created:    stripe.Int64(testBaseTime.Unix()),
			ListParams: stripe.ListParams{Limit: stripe.Int64(100)},
		}))
		require.Len(t, got, 255, "created=N is an exact match across customers")
	})

	t.Run("EndingBefore", func(t *testing.T) {
		t.Parallel()
		bundle, ids := setupMany(t)

		// Paging backwards from an old PaymentIntent walks towards newer ones.
		got := collect(t, bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{
			Customer:   stripe.String("cus_page"),
			ListParams: stripe.ListParams{EndingBefore: stripe.String(ids[9]), Limit: stripe.Int64(7)},
		}))
		require.Equal(t, ids[10:], got)
	})

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)

		iter := bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{ListParams: stripe.ListParams{Limit: stripe.Int64(101)}})
		require.False(t, iter.Next())
		stripeErr := requireStripeError(t, iter.Err(), http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, "")
		require.Equal(t, "limit", stripeErr.Param)

		iter = bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{ListParams: stripe.ListParams{StartingAfter: stripe.String("pi_missing")}})
		require.False(t, iter.Next())
		_ = requireStripeError(t, iter.Err(), http.StatusBadRequest, stripe.ErrorTypeInvalidRequest, stripe.ErrorCodeResourceMissing)
	})

	t.Run("Pages", func(t *testing.T) {
		t.Parallel()
		bundle, ids := setupMany(t)

		want := slices.Clone(ids)
		slices.Reverse(want) // newest first; same-second ties newest first too

		got := collect(t, bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{
			Customer:   stripe.String("cus_page"),
			ListParams: stripe.ListParams{Limit: stripe.Int64(100)},
		}))
		require.Equal(t, want, got)
		require.Equal(t, 3, bundle.sim.Stats().Requests["GET /v1/payment_intents"]["ok"], "270 items at 100 a page")

		// The default page size is 10.
		iter := bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{
			Customer:   stripe.String("cus_page"),
			ListParams: stripe.ListParams{Single: true},
		})
		require.Equal(t, want[:10], collect(t, iter))
		require.True(t, iter.Meta().HasMore)
		require.Equal(t, "/v1/payment_intents", iter.Meta().URL)

		// Everything, across customers, with an odd page size.
		all := collect(t, bundle.api.PaymentIntents.List(&stripe.PaymentIntentListParams{
			ListParams: stripe.ListParams{Limit: stripe.Int64(7)},
		}))
		require.Len(t, all, 275)
	})
}
