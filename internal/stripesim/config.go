package stripesim

import (
	"io"
	"log/slog"
	"net/http"
	"time"
)

// IdempotencyRetentionDefault is the default for Config.IdempotencyRetention: Stripe keeps an
// idempotency key's result for at least 24 hours after the first request that used it.
const IdempotencyRetentionDefault = 24 * time.Hour

// WebhookSecretDefault is the signing secret used when Config.WebhookSecret is empty.
const WebhookSecretDefault = "whsec_stripesim"

// WebhookMaxAttemptsDefault is the default for Config.WebhookMaxAttempts.
const WebhookMaxAttemptsDefault = 4

// WebhookRetryBackoffDefault is the default for Config.WebhookRetryBackoff.
const WebhookRetryBackoffDefault = 250 * time.Millisecond

// WebhookQueueSizeDefault is the default for Config.WebhookQueueSize.
const WebhookQueueSizeDefault = 1024

// WebhookTimeoutDefault is the timeout of one webhook delivery attempt when
// Config.WebhookHTTPClient is nil.
const WebhookTimeoutDefault = 10 * time.Second

// APIVersion is the Stripe API version the simulator renders objects and events in. It is the
// version pinned by stripe-go v76.
const APIVersion = "2023-10-16"

// Config configures a Server. Its zero value works: no webhooks, wall clock, discarded logs.
type Config struct {
	// Logger receives the simulator's logs. Nil discards them.
	Logger *slog.Logger

	// Now is the base clock. The simulator's clock is Now() plus an offset that the control
	// API advances (ClockAdvance). Nil means time.Now.
	Now func() time.Time

	// IdempotencyRetention is how long, on the simulator's clock, an idempotency key's stored
	// result is kept after the first request that used it. After that the key acts as new.
	// Zero means IdempotencyRetentionDefault.
	IdempotencyRetention time.Duration

	// WebhookURL is where events are POSTed. Empty means events are recorded (EventList) but
	// not delivered until a URL is set with WebhookModeSet.
	WebhookURL string

	// WebhookSecret signs deliveries (Stripe-Signature header, v1 scheme). Empty means
	// WebhookSecretDefault.
	WebhookSecret string

	// WebhookHTTPClient delivers webhooks. Nil means a client with WebhookTimeoutDefault.
	WebhookHTTPClient *http.Client

	// WebhookMaxAttempts bounds delivery attempts per event copy (the first attempt included);
	// a non-2xx answer or a transport error is retried with exponential backoff. Zero means
	// WebhookMaxAttemptsDefault.
	WebhookMaxAttempts int

	// WebhookRetryBackoff is the delay before the first retry; it doubles on each further retry.
	// Zero means WebhookRetryBackoffDefault.
	WebhookRetryBackoff time.Duration

	// WebhookQueueSize bounds the delivery queue. When it is full new deliveries are dropped
	// (logged and counted in Stats.WebhookDropped); EventResend can send them later. Zero means
	// WebhookQueueSizeDefault.
	WebhookQueueSize int
}

// WithDefaults returns a copy of the config with every zero field filled with its default.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.IdempotencyRetention <= 0 {
		c.IdempotencyRetention = IdempotencyRetentionDefault
	}
	if c.WebhookSecret == "" {
		c.WebhookSecret = WebhookSecretDefault
	}
	if c.WebhookHTTPClient == nil {
		c.WebhookHTTPClient = &http.Client{Timeout: WebhookTimeoutDefault}
	}
	if c.WebhookMaxAttempts <= 0 {
		c.WebhookMaxAttempts = WebhookMaxAttemptsDefault
	}
	if c.WebhookRetryBackoff <= 0 {
		c.WebhookRetryBackoff = WebhookRetryBackoffDefault
	}
	if c.WebhookQueueSize <= 0 {
		c.WebhookQueueSize = WebhookQueueSizeDefault
	}
	return c
}
