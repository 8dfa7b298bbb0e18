package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
)

// TestPaymentIntentsThatCount covers which of a charge's PaymentIntents on
// Stripe say something of it when several carry its key (dunning retries
// leave canceled ones behind).
func TestPaymentIntentsThatCount(t *testing.T) {
	t.Parallel()
	pi := func(id string, status stripe.PaymentIntentStatus, created int64) *stripe.PaymentIntent {
		return &stripe.PaymentIntent{ID: id, Status: status, Created: created}
	}
	const (
		ok       = stripe.PaymentIntentStatusSucceeded
		busy     = stripe.PaymentIntentStatusProcessing
		declined = stripe.PaymentIntentStatusRequiresPaymentMethod
		canceled = stripe.PaymentIntentStatusCanceled
	)
	ids := func(pis []*stripe.PaymentIntent) []string {
		out := []string{}
		for _, p := range pis {
			out = append(out, p.ID)
		}
		return out
	}
	for name, tc := range map[string]struct {
		retired []string
		pis     []*stripe.PaymentIntent
		want    []string
	}{
		"none":                               {nil, nil, []string{}},
		"one declined":                       {nil, []*stripe.PaymentIntent{pi("a", declined, 1)}, []string{"a"}},
		"retired ones say nothing":           {[]string{"a"}, []*stripe.PaymentIntent{pi("a", canceled, 1), pi("b", declined, 2)}, []string{"b"}},
		"only retired ones: nothing":         {[]string{"a", "b"}, []*stripe.PaymentIntent{pi("a", canceled, 1), pi("b", canceled, 2)}, []string{}},
		"a retired one that moved counts":    {[]string{"a"}, []*stripe.PaymentIntent{pi("a", ok, 1)}, []string{"a"}},
		"paid after canceled ones (restore)": {nil, []*stripe.PaymentIntent{pi("a", canceled, 1), pi("b", canceled, 2), pi("c", ok, 3)}, []string{"c"}},
		"declined after canceled ones":       {nil, []*stripe.PaymentIntent{pi("a", canceled, 1), pi("b", declined, 2)}, []string{"b"}},
		"only canceled: the newest":          {nil, []*stripe.PaymentIntent{pi("b", canceled, 2), pi("a", canceled, 1)}, []string{"b"}},
		"two paid: a double charge":          {nil, []*stripe.PaymentIntent{pi("a", ok, 1), pi("b", busy, 2)}, []string{"a", "b"}},
		"paid beside an open one: held":      {nil, []*stripe.PaymentIntent{pi("a", declined, 1), pi("b", ok, 2)}, []string{"b", "a"}},
		"two open: held":                     {nil, []*stripe.PaymentIntent{pi("a", declined, 1), pi("b", declined, 2)}, []string{"a", "b"}},
	} {
		c := &ledger.Charge{RetiredPaymentIntentIDs: tc.retired}
		require.Equal(t, tc.want, ids(jobs.PaymentIntentsThatCount(c, tc.pis)), name)
	}
}
