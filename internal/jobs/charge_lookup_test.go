package jobs_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
)

// lostCall creates on Stripe the PaymentIntent that an earlier call of the
// charge of (customerID, 2026-11) made with its generation-0 key — a call
// whose record this database lost (a restored backup, a lossy failover) —
// then makes the simulator forget every key, as Stripe does 24 h after a
// key's first use.
func (b *testBundle) lostCall(t *testing.T, ctx context.Context, customerID string, amount int64) *stripe.PaymentIntent {
	t.Helper()
	return b.lostCallFor(t, ctx, "cus_"+customerID, customerID, amount)
}

// lostCallFor is lostCall with the charge of customerID on Stripe customer
// stripeCustomer.
func (b *testBundle) lostCallFor(t *testing.T, ctx context.Context, stripeCustomer, customerID string, amount int64) *stripe.PaymentIntent {
	t.Helper()
	params := &stripe.PaymentIntentParams{
		Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String(stripeCustomer),
		PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true),
	}
	params.AddMetadata("tally_charge_key", ledger.ChargeKey("default", customerID, "2026-11"))
	params.AddMetadata("tally_namespace", "default")
	params.AddMetadata("customer_id", customerID)
	params.AddMetadata("period", "2026-11")
	params.SetIdempotencyKey(fmt.Sprintf("%s-%d", ledger.ChargeIdempotencyKey("default", customerID, "2026-11", 0), len(b.sim.PaymentIntentList())))
	pi, err := b.stripe.PaymentIntentCreate(ctx, params)
	require.NoError(t, err)
	b.sim.IdempotencyExpire(0)
	return pi
}

// TestChargeLookup covers money path steps 5 and 6 before a generation's first
// call: this database holds no attempt of the key, so the worker lists the
// customer's PaymentIntents on Stripe and matches the charge key first.
func TestChargeLookup(t *testing.T) {
	t.Parallel()

	t.Run("AdoptsAFailedPaymentIntent", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		total := b.customerWithEvents(t, ctx, "acme", 700)
		b.fault(t, stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindDecline, DeclineCode: "insufficient_funds", Count: 1})
		params := &stripe.PaymentIntentParams{
			Amount: stripe.Int64(total), Currency: stripe.String("usd"), Customer: stripe.String("cus_acme"),
			PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true),
		}
		params.AddMetadata("tally_charge_key", ledger.ChargeKey("default", "acme", "2026-11"))
		params.AddMetadata("tally_namespace", "default")
		_, err := b.stripe.PaymentIntentCreate(ctx, params)
		require.Error(t, err, "the lost call was declined")
		b.closeNow(t, ctx, "acme")

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeFailed))
		require.Equal(t, "card_declined", *c.FailureCode)
		require.Len(t, b.paymentIntents("cus_acme"), 1)
		require.Empty(t, b.attempts(t, ctx, c.ID))
	})

	t.Run("AdoptsThePaymentIntentOfALostCall", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		total := b.customerWithEvents(t, ctx, "acme", 700, 50)
		pi := b.lostCall(t, ctx, "acme", total)
		b.closeNow(t, ctx, "acme")

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, pi.ID, *c.StripePaymentIntentID)
		require.Equal(t, "reconcile", *c.ResolvedBy)
		require.Equal(t, []string{pi.ID}, b.paymentIntents("cus_acme"), "no second PaymentIntent")
		require.Empty(t, b.attempts(t, ctx, c.ID), "no call was made")
		b.waitJobsFinalized(t)
	})

	t.Run("NoneFoundCalls", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.customerWithEvents(t, ctx, "acme", 700)
		// Another charge's PaymentIntent on the same Stripe customer.
		b.lostCallFor(t, ctx, "cus_acme", "other", 700)
		b.closeNow(t, ctx, "acme")

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Len(t, b.paymentIntents("cus_acme"), 2)
		require.Equal(t, []string{"succeeded"}, b.attempts(t, ctx, c.ID))
		require.Equal(t, 1, b.sim.Stats().Requests["GET /v1/payment_intents"]["ok"])
	})

	t.Run("OneForAnotherAmountIsHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		total := b.customerWithEvents(t, ctx, "acme", 700)
		// The restored ledger sums to less than what was charged.
		pi := b.lostCall(t, ctx, "acme", total+50)
		b.closeNow(t, ctx, "acme")

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))
		require.Equal(t, ledger.HeldPaymentIntentMismatch, *c.HeldReason)
		require.Contains(t, *c.HeldDetail, pi.ID)
		require.Nil(t, c.StripePaymentIntentID)
		require.Equal(t, []string{pi.ID}, b.paymentIntents("cus_acme"), "never a new call")
		require.Empty(t, b.attempts(t, ctx, c.ID))
		b.waitJobsFinalized(t)
	})

	t.Run("SeveralAreHeldAsADoubleCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		total := b.customerWithEvents(t, ctx, "acme", 700)
		b.lostCall(t, ctx, "acme", total)
		b.lostCall(t, ctx, "acme", total)
		b.closeNow(t, ctx, "acme")

		c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeHeld))
		require.Equal(t, ledger.HeldDoubleCharge, *c.HeldReason)
		require.Len(t, b.paymentIntents("cus_acme"), 2, "nothing more was charged")
		require.Empty(t, b.attempts(t, ctx, c.ID))
		b.waitJobsFinalized(t)
	})
}
