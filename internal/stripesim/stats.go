package stripesim

import "maps"

// Stats counts what the simulator saw since the last Reset.
type Stats struct {
	// Requests counts Stripe API requests by endpoint pattern (e.g. "POST /v1/payment_intents")
	// and outcome. Outcomes of PaymentIntent creation: succeeded, created (confirm=false),
	// declined, authentication_required, requires_action, processing,
	// error_500_before_create, error_500_after_create, dropped, rate_limited, replayed,
	// idempotency_error, idempotency_key_in_use, invalid_request, unauthorized. Outcomes of
	// refund creation ("POST /v1/refunds"): succeeded, charge_not_refundable,
	// charge_already_refunded, amount_too_large, error_500_before_create,
	// error_500_after_create, dropped, rate_limited, replayed, idempotency_error,
	// idempotency_key_in_use, invalid_request, unauthorized. Other endpoints: ok, not_found,
	// invalid_request, unauthorized.
	Requests map[string]map[string]int `json:"requests"`

	// IdempotentReplays counts responses replayed from an idempotency key.
	IdempotentReplays int `json:"idempotent_replays"`

	// PaymentIntentsCreated counts PaymentIntents created, including those behind faulted
	// responses.
	PaymentIntentsCreated int `json:"payment_intents_created"`

	// RefundsCreated counts refunds made, through POST /v1/refunds (including those behind
	// faulted responses) and through ChargeRefund.
	RefundsCreated int `json:"refunds_created"`

	// EventsCreated counts events generated.
	EventsCreated int `json:"events_created"`

	// WebhookAttempts counts HTTP delivery attempts (duplicates, retries and resends
	// included).
	WebhookAttempts int `json:"webhook_attempts"`

	// WebhookDelivered counts attempts answered 2xx.
	WebhookDelivered int `json:"webhook_delivered"`

	// WebhookFailed counts deliveries abandoned after Config.WebhookMaxAttempts attempts.
	WebhookFailed int `json:"webhook_failed"`

	// WebhookDropped counts deliveries dropped because the queue was full.
	WebhookDropped int `json:"webhook_dropped"`
}

// Stats returns a copy of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requestsMu.Lock()
	defer s.requestsMu.Unlock()
	out := s.stats
	out.Requests = make(map[string]map[string]int, len(s.stats.Requests))
	for endpoint, outcomes := range s.stats.Requests {
		out.Requests[endpoint] = maps.Clone(outcomes)
	}
	return out
}

// statsRecordRequest counts one request. It takes requestsMu only: the caller may hold mu.
func (s *Server) statsRecordRequest(endpoint, outcome string) {
	s.requestsMu.Lock()
	defer s.requestsMu.Unlock()
	byOutcome, ok := s.stats.Requests[endpoint]
	if !ok {
		byOutcome = map[string]int{}
		s.stats.Requests[endpoint] = byOutcome
	}
	byOutcome[outcome]++
}
