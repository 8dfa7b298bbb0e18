package jobs

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/webhook"
)

// Test access to the worker's crash points and timing knobs.

var ErrCrash = errCrash

const (
	CrashAfterClaim      = crashAfterClaim
	CrashAfterCancel     = crashAfterCancel
	CrashAfterRetryBegin = crashAfterRetryBegin
	CrashAfterLookup     = crashAfterLookup
	CrashAfterStripe     = crashAfterStripe
	CrashBeforeComplete  = crashBeforeComplete

	CrashTopUpAfterClaim     = crashTopUpAfterClaim
	CrashTopUpAfterStripe    = crashTopUpAfterStripe
	CrashTopUpBeforeComplete = crashTopUpBeforeComplete
)

func SetCrashHook(c *WorkerConfig, hook func(point string) error) { c.crashHook = hook }

func SetRetryLaterSnooze(c *WorkerConfig, d time.Duration) { c.retryLaterSnooze = d }

var (
	DeliveryAddressCheck    = deliveryAddressCheck
	DeliveryClient          = deliveryClient
	NewDeliveryDialer       = newDeliveryDialer
	TextExcerpt             = textExcerpt
	PaymentIntentsThatCount = paymentIntentsThatCount
)

// DeliveryDialer is the dialer of deliveries.
type DeliveryDialer = deliveryDialer

// NewRecordingDeliveryDialer returns the dialer of deliveries under policy,
// resolving with resolver and handing the addresses it would connect to to
// dial instead.
func NewRecordingDeliveryDialer(policy webhook.AddressPolicy, resolver webhook.Resolver,
	dial func(ctx context.Context, network, address string) (net.Conn, error)) *DeliveryDialer {
	return &deliveryDialer{policy: policy, resolver: resolver, dial: dial}
}

// NewWebhookDeliveryWorker returns the delivery worker, connecting through
// dialer.
func NewWebhookDeliveryWorker(l *ledger.Ledger, logger *slog.Logger, dialer *DeliveryDialer) *WebhookDeliveryWorker {
	return newWebhookDeliveryWorker(l, logger, time.Second, dialer)
}
