package jobs

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestLeaseLeft(t *testing.T) {
	t.Parallel()
	w := &ChargePeriodWorker{leaseTTL: 60 * time.Second, stripeTimeout: 30 * time.Second}
	ctx := context.Background()
	require.NoError(t, w.leaseLeft(ctx, time.Now()))
	require.NoError(t, w.leaseLeft(ctx, time.Now().Add(-20*time.Second)))
	require.ErrorContains(t, w.leaseLeft(ctx, time.Now().Add(-30*time.Second)), "lease left", "a stalled run must not call Stripe")
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, w.leaseLeft(canceled, time.Now()), context.Canceled)
}

// Queues names every queue the worker client runs, so River UI's guard
// (api.WithRiverUI) covers each.
func TestQueues(t *testing.T) {
	t.Parallel()
	require.ElementsMatch(t, Queues, slices.Collect(maps.Keys(queueConfigs(WorkerConfig{}))))
}

func TestReconcileOutcome(t *testing.T) {
	t.Parallel()
	c := &ledger.Charge{ChargeKey: "k", AmountCents: 500, Currency: "usd", StripeCustomerID: "cus_1"}
	pi := func(id string, amount int64, customer string, status stripe.PaymentIntentStatus) *stripe.PaymentIntent {
		return &stripe.PaymentIntent{ID: id, Amount: amount, Currency: "usd", Customer: &stripe.Customer{ID: customer}, Status: status,
			Metadata: map[string]string{"tally_charge_key": "k"}}
	}

	_, found := reconcileOutcome(c, nil, false)
	require.False(t, found)

	o, found := reconcileOutcome(c, []*stripe.PaymentIntent{pi("pi_1", 500, "cus_1", stripe.PaymentIntentStatusSucceeded)}, false)
	require.True(t, found)
	require.Equal(t, ledger.OutcomeSucceeded, o.Class)
	require.Equal(t, "reconcile", o.ResolvedBy)

	o, _ = reconcileOutcome(c, []*stripe.PaymentIntent{pi("pi_1", 499, "cus_1", stripe.PaymentIntentStatusSucceeded)}, false)
	require.Equal(t, ledger.OutcomeHeld, o.Class, "a PaymentIntent for another amount is not adopted")
	require.Empty(t, o.StripePaymentIntentID)

	o, _ = reconcileOutcome(c, []*stripe.PaymentIntent{pi("pi_1", 500, "cus_2", stripe.PaymentIntentStatusSucceeded)}, false)
	require.Equal(t, ledger.OutcomeHeld, o.Class, "nor one of another customer")

	o, _ = reconcileOutcome(c, []*stripe.PaymentIntent{
		pi("pi_1", 500, "cus_1", stripe.PaymentIntentStatusSucceeded), pi("pi_2", 500, "cus_1", stripe.PaymentIntentStatusSucceeded)}, false)
	require.Equal(t, ledger.OutcomeHeld, o.Class)
	require.Equal(t, ledger.HeldDoubleCharge, o.HeldReason)

	live := pi("pi_1", 500, "cus_1", stripe.PaymentIntentStatusSucceeded)
	live.Livemode = true
	o, _ = reconcileOutcome(c, []*stripe.PaymentIntent{live}, false)
	require.Equal(t, ledger.HeldPaymentIntentMismatch, o.HeldReason, "a live PaymentIntent is never a test-mode charge's")
	require.Contains(t, o.ErrorMessage, "livemode true, not false")
}
