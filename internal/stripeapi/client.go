// Package stripeapi is Tally's client of Stripe: the calls the charge path makes
// (stripe-go, its retries off), the request of a charge, and what Stripe's answers mean for
// the ledger (Classify, OutcomeOf).
package stripeapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/metrics"
)

// TimeoutDefault bounds one Stripe call when Config.Timeout is zero.
const TimeoutDefault = 30 * time.Second

// Config configures Client.
type Config struct {
	// APIKey is the Stripe key (rk_… recommended). Required.
	APIKey string

	// BaseURL overrides Stripe's API URL (the simulator, stripe-mock).
	BaseURL string

	// Timeout bounds each call. Default TimeoutDefault.
	Timeout time.Duration

	// MaxIdleConns is how many connections to Stripe are kept open between
	// calls, so every worker reuses a warm (TLS) connection instead of
	// dialing one per call. Default MaxIdleConnsDefault.
	MaxIdleConns int

	// Logger receives stripe-go's own logs at debug level. Default: discarded.
	Logger *slog.Logger

	// Metrics counts every call (tally_stripe_requests_total) and its
	// duration. Nil: not counted.
	Metrics *metrics.Metrics
}

// MaxIdleConnsDefault is Config.MaxIdleConns when zero. (Go's
// default transport keeps 2 idle connections per host, so 50 workers would
// dial, and handshake TLS, on almost every call.)
const MaxIdleConnsDefault = 64

// Client is Stripe through stripe-go, with stripe-go's own retries off:
// every retry goes through River and the charge's attempt log.
type Client struct {
	api      *client.API
	timeout  time.Duration
	livemode bool
	metrics  *metrics.Metrics
}

// observe counts a call of operation that started at start and ended with
// err, and returns err.
func (s *Client) observe(operation string, start time.Time, err error) error {
	s.metrics.ObserveStripe(operation, err, time.Since(start))
	return err
}

// Livemode implements jobs.Stripe from the key's prefix.
func (s *Client) Livemode() bool { return s.livemode }

// New returns a Client for config.
func New(config Config) *Client {
	if config.Timeout == 0 {
		config.Timeout = TimeoutDefault
	}
	if config.MaxIdleConns == 0 {
		config.MaxIdleConns = MaxIdleConnsDefault
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = config.MaxIdleConns
	transport.MaxIdleConnsPerHost = config.MaxIdleConns
	backendConfig := &stripe.BackendConfig{
		HTTPClient:        &http.Client{Timeout: config.Timeout, Transport: transport},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     stripeLogger{config.Logger},
		EnableTelemetry:   stripe.Bool(false),
	}
	if config.BaseURL != "" {
		backendConfig.URL = stripe.String(config.BaseURL)
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, backendConfig)
	api := &client.API{}
	api.Init(config.APIKey, &stripe.Backends{API: backend, Connect: backend, Uploads: backend})
	live := strings.HasPrefix(config.APIKey, "sk_live_") || strings.HasPrefix(config.APIKey, "rk_live_")
	return &Client{api: api, timeout: config.Timeout, livemode: live, metrics: config.Metrics}
}

// call makes one call of operation, bounded by the configured timeout
// (params carries the context), and counts it.
func call[T any](ctx context.Context, s *Client, operation string, params stripe.ParamsContainer, do func() (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	params.GetParams().Context = ctx
	start := time.Now()
	v, err := do()
	return v, s.observe(operation, start, err)
}

// PaymentIntentCreate implements jobs.Stripe.
func (s *Client) PaymentIntentCreate(ctx context.Context, params *stripe.PaymentIntentParams) (*stripe.PaymentIntent, error) {
	return call(ctx, s, "payment_intent_create", params, func() (*stripe.PaymentIntent, error) { return s.api.PaymentIntents.New(params) })
}

// CustomerGet implements jobs.Stripe.
func (s *Client) CustomerGet(ctx context.Context, id string) (*stripe.Customer, error) {
	params := &stripe.CustomerParams{}
	return call(ctx, s, "customer_get", params, func() (*stripe.Customer, error) { return s.api.Customers.Get(id, params) })
}

// PaymentIntentGet implements jobs.Stripe.
func (s *Client) PaymentIntentGet(ctx context.Context, id string) (*stripe.PaymentIntent, error) {
	params := &stripe.PaymentIntentParams{}
	return call(ctx, s, "payment_intent_get", params, func() (*stripe.PaymentIntent, error) { return s.api.PaymentIntents.Get(id, params) })
}

// PaymentIntentCancel implements jobs.Stripe.
func (s *Client) PaymentIntentCancel(ctx context.Context, id string) (*stripe.PaymentIntent, error) {
	params := &stripe.PaymentIntentCancelParams{}
	return call(ctx, s, "payment_intent_cancel", params, func() (*stripe.PaymentIntent, error) { return s.api.PaymentIntents.Cancel(id, params) })
}

// RefundCreate implements jobs.Stripe.
func (s *Client) RefundCreate(ctx context.Context, params *stripe.RefundParams) (*stripe.Refund, error) {
	return call(ctx, s, "refund_create", params, func() (*stripe.Refund, error) { return s.api.Refunds.New(params) })
}

// PaymentIntentList implements jobs.Stripe with the list endpoint (never Search,
// which lags), 100 per page; each page is bounded by the configured timeout.
func (s *Client) PaymentIntentList(ctx context.Context, customer string, since time.Time) ([]*stripe.PaymentIntent, error) {
	params := &stripe.PaymentIntentListParams{}
	if customer != "" { // "": every customer's (billingctl recover's look for lost charges)
		params.Customer = stripe.String(customer)
	}
	params.Filters.AddFilter("created", "gte", fmt.Sprint(since.Unix()))
	params.Limit = stripe.Int64(100)
	params.Context = ctx
	var all []*stripe.PaymentIntent
	for {
		pageCtx, cancel := context.WithTimeout(ctx, s.timeout)
		params.Context = pageCtx
		start := time.Now()
		iter := s.api.PaymentIntents.List(params)
		var last string
		n := 0
		for iter.Next() {
			pi := iter.PaymentIntent()
			all = append(all, pi)
			last = pi.ID
			n++
			if n == 100 {
				break // one page; the next request starts after the last item
			}
		}
		err := s.observe("payment_intent_list", start, iter.Err()) // one request per page
		more := iter.Meta() != nil && iter.Meta().HasMore && n == 100
		cancel()
		if err != nil {
			return nil, fmt.Errorf("error listing PaymentIntents of %s: %w", customer, err)
		}
		if !more {
			return all, nil
		}
		params.StartingAfter = stripe.String(last)
	}
}

// PaymentIntentParams is the PaymentIntent request of a claimed charge: a
// pure function of the charge row, so every attempt of a key generation
// sends identical parameters (Stripe rejects a reused key with others).
func PaymentIntentParams(c *ledger.Charge) *stripe.PaymentIntentParams {
	params := &stripe.PaymentIntentParams{
		Amount:        stripe.Int64(c.AmountCents),
		Currency:      stripe.String(c.Currency),
		Customer:      stripe.String(c.StripeCustomerID),
		PaymentMethod: c.StripePaymentMethodID,
		Confirm:       stripe.Bool(true),
		OffSession:    stripe.Bool(true),
		Description:   stripe.String(fmt.Sprintf("Usage for %s (%s)", c.Period, c.CustomerID)),
	}
	params.AddMetadata("tally_charge_key", c.ChargeKey)
	if c.KeyNamespace != "" {
		params.AddMetadata("tally_namespace", c.KeyNamespace)
	}
	params.AddMetadata("customer_id", c.CustomerID)
	params.AddMetadata("period", c.Period)
	params.AddMetadata("charge_id", fmt.Sprint(c.ID))
	params.SetIdempotencyKey(c.IdempotencyKey)
	return params
}

// Classify turns the result of a PaymentIntent create into the ledger's
// outcome (docs/design.md, Outcomes).
func Classify(pi *stripe.PaymentIntent, err error) ledger.Outcome {
	if err == nil {
		o := OutcomeOf(pi)
		o.HTTPStatus = http.StatusOK
		if pi.LastResponse != nil {
			o.StripeRequestID = pi.LastResponse.RequestID
		}
		return o
	}

	var se *stripe.Error
	if !errors.As(err, &se) {
		// Timeout, dropped connection, DNS: the request may have been
		// executed. The same key will tell.
		return ledger.Outcome{Class: ledger.OutcomeUnknown, ErrorType: "network_error", ErrorMessage: err.Error()}
	}
	o := ledger.Outcome{
		HTTPStatus: se.HTTPStatusCode, StripeRequestID: se.RequestID,
		ErrorType: string(se.Type), ErrorCode: string(se.Code), ErrorMessage: se.Msg,
	}
	if se.DeclineCode != "" {
		o.ErrorMessage = fmt.Sprintf("%s (decline_code %s)", se.Msg, se.DeclineCode)
	}
	if se.PaymentIntent != nil {
		o.StripePaymentIntentID = se.PaymentIntent.ID
	}
	switch {
	case se.HTTPStatusCode == http.StatusTooManyRequests || se.Code == stripe.ErrorCodeRateLimit:
		o.Class = ledger.OutcomeRetryLater
	case se.Code == stripe.ErrorCodeIdempotencyKeyInUse || se.HTTPStatusCode == http.StatusConflict:
		o.Class = ledger.OutcomeRetryLater
	case se.Type == stripe.ErrorTypeIdempotency:
		// Our parameters for this key changed: a bug, never a retry.
		o.Class, o.HeldReason = ledger.OutcomeHeld, ledger.HeldIdempotencyError
	case se.HTTPStatusCode >= 500 || se.Type == stripe.ErrorTypeAPI:
		o.Class = ledger.OutcomeUnknown
	case se.HTTPStatusCode == http.StatusUnauthorized || se.HTTPStatusCode == http.StatusForbidden:
		// Our key is wrong or lacks a permission; nothing was created.
		o.Class = ledger.OutcomeError
	case se.Type == stripe.ErrorTypeCard || se.HTTPStatusCode == http.StatusPaymentRequired:
		o.Class = ledger.OutcomeFailed
	case se.Param == "payment_method" &&
		(se.Code == stripe.ErrorCodePaymentIntentUnexpectedState || se.Code == stripe.ErrorCodeResourceMissing):
		// No payment method to confirm with (none registered, no default
		// on Stripe, or one deleted since): nothing was created, and a try
		// once the customer has one can succeed.
		o.Class, o.ErrorCode = ledger.OutcomeFailed, ledger.FailureNoPaymentMethod
		o.ErrorMessage = fmt.Sprintf("%s (%s)", se.Msg, se.Code)
	case se.Type == stripe.ErrorTypeInvalidRequest || se.HTTPStatusCode == http.StatusBadRequest ||
		se.HTTPStatusCode == http.StatusNotFound:
		o.Class = ledger.OutcomeFailed
	default:
		o.Class = ledger.OutcomeUnknown
	}
	if o.Class == ledger.OutcomeFailed && o.ErrorCode == "" {
		o.ErrorCode = string(se.Type)
	}
	return o
}

// OutcomeOf says what a PaymentIntent's status means for its
// charge: the same mapping for an API answer, a reconciliation and a webhook.
func OutcomeOf(pi *stripe.PaymentIntent) ledger.Outcome {
	o := ledger.Outcome{StripePaymentIntentID: pi.ID}
	switch pi.Status {
	case stripe.PaymentIntentStatusSucceeded:
		o.Class = ledger.OutcomeSucceeded
		if pi.LatestCharge != nil {
			o.StripeChargeID = pi.LatestCharge.ID
		}
	case stripe.PaymentIntentStatusProcessing:
		o.Class = ledger.OutcomeProcessing
	case stripe.PaymentIntentStatusRequiresAction, stripe.PaymentIntentStatusRequiresPaymentMethod,
		stripe.PaymentIntentStatusCanceled:
		o.Class = ledger.OutcomeFailed
		o.ErrorCode = string(pi.Status)
		if pi.LastPaymentError != nil && pi.LastPaymentError.Code != "" {
			o.ErrorCode = string(pi.LastPaymentError.Code)
			o.ErrorMessage = pi.LastPaymentError.Msg
		}
		if o.ErrorMessage == "" {
			o.ErrorMessage = "the payment needs the customer: the PaymentIntent is " + string(pi.Status)
		}
	default:
		// requires_confirmation or requires_capture cannot follow
		// confirm=true with automatic capture: a human must look.
		o.Class, o.HeldReason = ledger.OutcomeHeld, ledger.HeldUnexpectedStatus
		o.ErrorCode = string(pi.Status)
		o.ErrorMessage = "PaymentIntent " + pi.ID + " is " + string(pi.Status)
	}
	return o
}

// stripeLogger sends stripe-go's logs to slog at debug level: Tally logs
// each call's outcome itself.
type stripeLogger struct{ logger *slog.Logger }

func (l stripeLogger) log(format string, v ...any) {
	if l.logger != nil {
		l.logger.Debug(fmt.Sprintf(format, v...), slog.String("component", "stripe-go"))
	}
}

// Debugf drops stripe-go's debug lines: they carry whole response bodies,
// with each PaymentIntent's client_secret and the customer's card details.
func (l stripeLogger) Debugf(string, ...any)          {}
func (l stripeLogger) Infof(format string, v ...any)  { l.log(format, v...) }
func (l stripeLogger) Warnf(format string, v ...any)  { l.log(format, v...) }
func (l stripeLogger) Errorf(format string, v ...any) { l.log(format, v...) }

// TopUpPaymentIntentParams is the PaymentIntent request of top-up t: a pure
// function of its row, so every call of a key generation sends identical
// parameters; metadata.tally_top_up_key is the look-up's.
func TopUpPaymentIntentParams(t *ledger.TopUp) *stripe.PaymentIntentParams {
	params := &stripe.PaymentIntentParams{
		Amount:        stripe.Int64(t.AmountCents),
		Currency:      stripe.String(t.Currency),
		Customer:      stripe.String(t.StripeCustomerID),
		PaymentMethod: t.StripePaymentMethodID,
		Confirm:       stripe.Bool(true),
		OffSession:    stripe.Bool(true),
		Description:   stripe.String(fmt.Sprintf("Credits top-up %s (%s)", t.TopUpID, t.CustomerID)),
	}
	params.AddMetadata("tally_top_up_key", t.Key)
	if t.KeyNamespace != "" {
		params.AddMetadata("tally_namespace", t.KeyNamespace)
	}
	params.AddMetadata("customer_id", t.CustomerID)
	params.AddMetadata("top_up_id", t.TopUpID)
	params.SetIdempotencyKey(t.IdempotencyKey())
	return params
}
