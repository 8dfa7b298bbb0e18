package jobs

import (
	"context"
	"time"

	"github.com/stripe/stripe-go/v76"
)

// Stripe is the part of Stripe's API that the charge path uses. stripeapi.Client
// implements it with stripe-go against Stripe, the simulator or stripe-mock;
// tests may fake it.
type Stripe interface {
	// PaymentIntentCreate creates (and confirms) a PaymentIntent.
	PaymentIntentCreate(ctx context.Context, params *stripe.PaymentIntentParams) (*stripe.PaymentIntent, error)

	// CustomerGet retrieves a customer, for its default payment method.
	CustomerGet(ctx context.Context, id string) (*stripe.Customer, error)

	// PaymentIntentGet retrieves a PaymentIntent.
	PaymentIntentGet(ctx context.Context, id string) (*stripe.PaymentIntent, error)

	// PaymentIntentCancel cancels a PaymentIntent that has not succeeded
	// nor started processing: it can never succeed after.
	PaymentIntentCancel(ctx context.Context, id string) (*stripe.PaymentIntent, error)

	// PaymentIntentList returns every PaymentIntent of a Stripe customer
	// (every customer's when customer is "") created at or after since,
	// paging through all of them.
	PaymentIntentList(ctx context.Context, customer string, since time.Time) ([]*stripe.PaymentIntent, error)

	// RefundCreate refunds (in full unless params say otherwise) a
	// PaymentIntent's charge.
	RefundCreate(ctx context.Context, params *stripe.RefundParams) (*stripe.Refund, error)

	// Livemode reports whether the key is a live one (sk_live_, rk_live_):
	// a PaymentIntent of the other mode is never a charge's.
	Livemode() bool
}
