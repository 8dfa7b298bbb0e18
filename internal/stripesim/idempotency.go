package stripesim

import (
	"net/http"
	"net/url"
	"time"
)

// idempotencyEntry is what the simulator remembers about one Idempotency-Key.
type idempotencyEntry struct {
	fingerprint string    // method, path and canonical parameters of the first request
	firstUsedAt time.Time // simulator clock; the key expires IdempotencyRetention later
	inFlight    bool      // the first request is still executing
	status      int       // stored response, once not in flight
	body        []byte
	requestID   string // Request-Id of the request whose response is stored
}

type idempotencyOutcome int

const (
	idempotencyOutcomeNew idempotencyOutcome = iota
	idempotencyOutcomeReplay
	idempotencyOutcomeMismatch
	idempotencyOutcomeInFlight
)

// idempotencySweepEvery is how many new keys are stored between sweeps of expired ones.
const idempotencySweepEvery = 1000

// idempotencyFingerprint identifies a request's parameters the way Stripe compares them: same
// endpoint and same parameters. url.Values.Encode sorts by key, so parameter order does not
// matter.
func idempotencyFingerprint(r *http.Request, form url.Values) string {
	return r.Method + " " + r.URL.Path + "\n" + form.Encode()
}

// idempotencyBeginLocked looks the key up. For a new (or expired) key it stores an in-flight
// entry and returns it with idempotencyOutcomeNew; otherwise it returns the existing entry and
// whether to replay it, reject a parameter mismatch, or reject a concurrent use. s.mu must be
// held.
func (s *Server) idempotencyBeginLocked(key, fingerprint string, now time.Time) (*idempotencyEntry, idempotencyOutcome) {
	if e, ok := s.idempotency[key]; ok {
		expired := !e.inFlight && now.Sub(e.firstUsedAt) >= s.cfg.IdempotencyRetention
		if !expired {
			switch {
			case e.fingerprint != fingerprint:
				return e, idempotencyOutcomeMismatch
			case e.inFlight:
				return e, idempotencyOutcomeInFlight
			default:
				return e, idempotencyOutcomeReplay
			}
		}
	}
	e := &idempotencyEntry{fingerprint: fingerprint, firstUsedAt: now, inFlight: true}
	s.idempotency[key] = e
	s.idempotencyInserts++
	if s.idempotencyInserts%idempotencySweepEvery == 0 {
		for k, old := range s.idempotency {
			if !old.inFlight && now.Sub(old.firstUsedAt) >= s.cfg.IdempotencyRetention {
				delete(s.idempotency, k)
			}
		}
	}
	return e, idempotencyOutcomeNew
}

// idempotencyAbandonLocked forgets an in-flight entry whose request stopped before executing
// (validation error), so that the key stays unused. s.mu must be held.
func (s *Server) idempotencyAbandonLocked(key string, e *idempotencyEntry) {
	if e != nil && s.idempotency[key] == e {
		delete(s.idempotency, key)
	}
}

// idempotencyCompleteLocked stores the final response of the request that holds the key. An
// entry dropped by Reset meanwhile is left alone. s.mu must be held.
func (s *Server) idempotencyCompleteLocked(key string, e *idempotencyEntry, status int, body []byte, requestID string) {
	if e == nil || s.idempotency[key] != e {
		return
	}
	e.inFlight = false
	e.status = status
	e.body = body
	e.requestID = requestID
}

// IdempotencyExpire forgets every stored idempotency key first used more
// than olderThan ago on the simulator's clock, as Stripe does once its
// retention has passed, and returns how many it forgot. Unlike ClockAdvance it
// leaves younger keys alone, so it models "these keys outlived Stripe's
// retention" without aging keys a client still rightly trusts.
func (s *Server) IdempotencyExpire(olderThan time.Duration) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	n := 0
	for k, e := range s.idempotency {
		if !e.inFlight && now.Sub(e.firstUsedAt) > olderThan {
			delete(s.idempotency, k)
			n++
		}
	}
	s.logger.Info("idempotency keys expired", "older_than", olderThan.String(), "count", n)
	return n
}
