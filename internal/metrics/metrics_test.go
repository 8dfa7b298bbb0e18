package metrics_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/metrics"
)

func TestStripeOutcome(t *testing.T) {
	for want, err := range map[string]error{
		"ok":            nil,
		"network_error": errors.New("dial tcp: i/o timeout"),
		"rate_limited":  &stripe.Error{HTTPStatusCode: 429, Code: stripe.ErrorCodeRateLimit},
		"server_error":  fmt.Errorf("wrapped: %w", &stripe.Error{HTTPStatusCode: 503, Type: stripe.ErrorTypeAPI}),
		"card_error":    &stripe.Error{HTTPStatusCode: 402, Type: stripe.ErrorTypeCard},
		"client_error":  &stripe.Error{HTTPStatusCode: 400, Type: stripe.ErrorTypeInvalidRequest},
	} {
		require.Equal(t, want, metrics.StripeOutcome(err), "%v", err)
	}
}

// A nil *Metrics counts nothing and never panics: tests and tools run
// without metrics.
func TestNilMetrics(t *testing.T) {
	var m *metrics.Metrics
	m.ObserveHTTP("GET /x", "GET", 200, 0)
	m.CountUsageEvents(metrics.UsageCreated, 1)
	m.ObserveBatch(3)
	m.ObserveStripe("customer_get", nil, 0)
	m.ChargeTransition("", "pending")
	m.RoleStarted("api")
	m.Register()
}
