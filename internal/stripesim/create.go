package stripesim

import (
	"net/http"
	"net/url"
	"strings"
)

// createResult is the final response of a create request that began executing; it is stored
// under the idempotency key.
type createResult struct {
	status  int
	body    []byte
	outcome string
	drop    bool // close the connection instead of answering
}

// createErrorResult renders e as the final, stored response of a create request, counted
// under outcome.
func createErrorResult(e *apiError, requestID, outcome string) createResult {
	e.RequestLogURL = requestLogURL(requestID)
	return createResult{status: e.status, body: mustJSON(apiErrorEnvelope{Error: e}), outcome: outcome}
}

// createOps are the endpoint-specific steps of a POST that creates an object under Stripe's
// idempotency rules; handleCreate runs them.
type createOps struct {
	// customerLocked returns the Stripe customer whose faults apply to the request, or "" when
	// only FaultCustomerAll faults apply. s.mu is held.
	customerLocked func(form url.Values) string

	// prepareLocked validates the parameters the way Stripe does before it starts executing a
	// request. It returns either the function that executes the request (called later, with
	// s.mu held, once any latency fault has passed), or the 400 to answer, which is not stored
	// under the idempotency key. s.mu is held.
	prepareLocked func(form url.Values) (execute func(requestID, idempotencyKey string) createResult, apiErr *apiError)
}

// handleCreate runs a create request (POST /v1/payment_intents, POST /v1/refunds) with
// Stripe's idempotency semantics, in this order:
//
//  1. a rate_limit fault for the request's customer answers 429; nothing is stored;
//  2. with an Idempotency-Key: a stored response is replayed (Idempotent-Replayed: true), other
//     parameters answer 400 idempotency_error, a request still executing answers 409
//     idempotency_key_in_use; otherwise the key is taken;
//  3. parameter validation errors answer 400 and release the key;
//  4. a latency fault for the customer delays the request while it holds the key; a client
//     that gives up does not stop it;
//  5. the request executes and its final response (success or error) is stored under the key,
//     then written, or the connection is dropped (drop_after_create).
func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request, rs *requestState, ops createOps) {
	form, apiErr := formParse(w, r)
	if apiErr != nil {
		s.writeError(w, rs, apiErr)
		return
	}
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	rs.idempotencyKey = key
	if len(key) > 255 {
		s.writeError(w, rs, errParameterInvalid("", "", "Idempotency-Key must be at most 255 characters."))
		return
	}

	s.mu.Lock()
	customerID := ops.customerLocked(form)
	if _, limited := s.faultTakeLocked(customerID, faultKindIs(FaultKindRateLimit)); limited {
		s.mu.Unlock()
		rs.outcome = "rate_limited"
		s.writeError(w, rs, errRateLimit())
		return
	}

	var entry *idempotencyEntry
	if key != "" {
		e, outcome := s.idempotencyBeginLocked(key, idempotencyFingerprint(r, form), s.nowLocked())
		switch outcome {
		case idempotencyOutcomeMismatch:
			s.mu.Unlock()
			rs.outcome = "idempotency_error"
			s.writeError(w, rs, errIdempotencyMismatch(key))
			return
		case idempotencyOutcomeInFlight:
			s.mu.Unlock()
			rs.outcome = "idempotency_key_in_use"
			s.writeError(w, rs, errIdempotencyKeyInUse(key))
			return
		case idempotencyOutcomeReplay:
			status, body, original := e.status, e.body, e.requestID
			s.stats.IdempotentReplays++
			s.mu.Unlock()
			rs.outcome = "replayed"
			w.Header().Set("Idempotent-Replayed", "true")
			w.Header().Set("Original-Request", original)
			s.writeJSONBytes(w, status, body)
			return
		case idempotencyOutcomeNew:
			entry = e
		}
	}

	execute, apiErr := ops.prepareLocked(form)
	if apiErr != nil {
		s.idempotencyAbandonLocked(key, entry)
		s.mu.Unlock()
		s.writeError(w, rs, apiErr)
		return
	}
	s.mu.Unlock()

	if !s.latencyApply(r.Context(), customerID) {
		s.logger.Info("client went away during injected latency; executing the request anyway, as Stripe would",
			"request_id", rs.requestID, "idempotency_key", key)
	}

	s.mu.Lock()
	result := execute(rs.requestID, key)
	s.idempotencyCompleteLocked(key, entry, result.status, result.body, rs.requestID)
	s.mu.Unlock()

	rs.outcome = result.outcome
	if result.drop {
		dropConnection(w, rs)
		return
	}
	s.writeJSONBytes(w, result.status, result.body)
}
