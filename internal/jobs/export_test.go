package jobs

import "time"

// Test access to the worker's crash points and timing knobs.

var ErrCrash = errCrash

const (
	CrashAfterClaim      = crashAfterClaim
	CrashAfterCancel     = crashAfterCancel
	CrashAfterRetryBegin = crashAfterRetryBegin
	CrashAfterLookup     = crashAfterLookup
	CrashAfterStripe     = crashAfterStripe
	CrashBeforeComplete  = crashBeforeComplete
)

func SetCrashHook(c *WorkerConfig, hook func(point string) error) { c.crashHook = hook }

func SetRetryLaterSnooze(c *WorkerConfig, d time.Duration) { c.retryLaterSnooze = d }

var (
	DeliveryAddressForbidden = deliveryAddressForbidden
	DeliveryClient           = deliveryClient
	TextExcerpt              = textExcerpt
	PaymentIntentsThatCount  = paymentIntentsThatCount
)
