package stripesim

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// formBodyLimit bounds request bodies, API and control alike.
const formBodyLimit = 1 << 20

// Server is the simulator: an http.Handler serving the Stripe API under /v1/ and the control
// API under /_sim/, plus the same control operations as methods. It is safe for concurrent
// use. Close stops webhook delivery.
type Server struct {
	cfg    Config
	logger *slog.Logger
	mux    *http.ServeMux

	// requestsMu guards stats.Requests alone, so a request can be counted while its handler
	// holds mu. Lock order: mu, then requestsMu.
	requestsMu sync.Mutex

	mu                 sync.Mutex
	clockOffset        time.Duration
	seq                int64
	paymentIntents     []*paymentIntent // creation order
	paymentIntentsByID map[string]*paymentIntent
	charges            map[string]*charge
	refunds            []*refund // creation order
	refundsByID        map[string]*refund
	disputes           map[string]*dispute
	customers          map[string]*customer
	faults             []*Fault
	idempotency        map[string]*idempotencyEntry
	idempotencyInserts int
	events             []*Event
	eventsByID         map[string]*Event
	stats              Stats
	webhookMode        WebhookMode

	webhookCtx      context.Context
	webhookCancel   context.CancelFunc
	webhookIncoming chan webhookDelivery
	webhookWork     chan webhookDelivery
	webhookWG       sync.WaitGroup
	closeOnce       sync.Once
}

// New returns a simulator configured by cfg (zero fields take their defaults, see Config) with
// its webhook delivery goroutines running. Call Close when done.
func New(cfg Config) *Server {
	cfg = cfg.WithDefaults()
	s := &Server{cfg: cfg, logger: cfg.Logger}
	s.resetLocked()
	s.mux = s.routes()
	s.webhookStart()
	return s
}

// ServeHTTP serves the Stripe API (/v1/…) and the control API (/_sim/…).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// Close stops webhook delivery and waits for the delivery goroutines to exit; queued
// deliveries are abandoned. The HTTP handler keeps answering. Close is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.webhookCancel()
		s.webhookWG.Wait()
	})
}

// Reset forgets every PaymentIntent, charge, refund, dispute, customer setting, idempotency key,
// fault, event and counter, queued webhook deliveries included, sets the clock offset back to
// zero and the webhook mode back to Config.WebhookURL with no duplicates, delay or reordering.
// Requests in flight finish but their results are not stored under their keys.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resetLocked()
	if s.webhookIncoming != nil {
		for drained := false; !drained; {
			select {
			case <-s.webhookIncoming:
			default:
				drained = true
			}
		}
	}
	s.logger.Info("simulator reset")
}

func (s *Server) resetLocked() {
	s.clockOffset = 0
	s.seq = 0
	s.paymentIntents = nil
	s.paymentIntentsByID = map[string]*paymentIntent{}
	s.charges = map[string]*charge{}
	s.refunds = nil
	s.refundsByID = map[string]*refund{}
	s.disputes = map[string]*dispute{}
	s.customers = map[string]*customer{}
	s.faults = nil
	s.idempotency = map[string]*idempotencyEntry{}
	s.idempotencyInserts = 0
	s.events = nil
	s.eventsByID = map[string]*Event{}
	s.requestsMu.Lock()
	s.stats = Stats{Requests: map[string]map[string]int{}}
	s.requestsMu.Unlock()
	s.webhookMode = WebhookMode{
		URL:           s.cfg.WebhookURL,
		ReorderWindow: WebhookReorderWindowDefault,
		ReorderFlush:  WebhookReorderFlushDefault,
	}
}

// requestState carries per-request facts from a Stripe API handler to the middleware that logs
// and counts it.
type requestState struct {
	requestID      string
	idempotencyKey string
	outcome        string

	// count records the request in Stats once. It runs before the first byte of the answer is
	// written (and before a connection is dropped), so a client that has its answer always
	// finds its request counted.
	count   func()
	counted bool
}

// countOnce runs rs.count the first time it is called.
func (rs *requestState) countOnce() {
	if rs.counted {
		return
	}
	rs.counted = true
	if rs.outcome == "" {
		rs.outcome = "ok"
	}
	rs.count()
}

// statusWriter remembers the status code written and counts the request before the answer
// leaves. Unwrap lets http.ResponseController reach the underlying writer (Hijack for
// drop_after_create).
type statusWriter struct {
	http.ResponseWriter
	rs     *requestState
	status int
}

// WriteHeader records the first status written and forwards it.
func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
		w.rs.countOnce()
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write records an implicit 200 and forwards the body.
func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
		w.rs.countOnce()
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// stripeHandler wraps a Stripe API handler: Request-Id header, API key check, then logging and
// counting by endpoint pattern and outcome.
func (s *Server) stripeHandler(h func(http.ResponseWriter, *http.Request, *requestState)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs := &requestState{requestID: idRequest()}
		endpoint := r.Pattern
		if endpoint == "" || endpoint == "/v1/" {
			endpoint = "unrecognized"
		}
		rs.count = func() { s.statsRecordRequest(endpoint, rs.outcome) }
		sw := &statusWriter{ResponseWriter: w, rs: rs}
		sw.Header().Set("Request-Id", rs.requestID)
		version := r.Header.Get("Stripe-Version")
		if version == "" {
			version = APIVersion
		}
		sw.Header().Set("Stripe-Version", version)
		if key := r.Header.Get("Idempotency-Key"); key != "" && r.Method == http.MethodPost {
			sw.Header().Set("Idempotency-Key", key)
		}

		if apiErr := apiKeyCheck(r); apiErr != nil {
			sw.Header().Set("WWW-Authenticate", `Basic realm="Stripe"`)
			s.writeError(sw, rs, apiErr)
		} else {
			h(sw, r, rs)
		}

		rs.countOnce() // a handler that wrote nothing
		s.logger.Info("stripe request",
			"method", r.Method,
			"path", r.URL.Path,
			"status", sw.status,
			"outcome", rs.outcome,
			"request_id", rs.requestID,
			"idempotency_key", rs.idempotencyKey,
		)
	})
}

// apiKeyCheck accepts "Authorization: Bearer sk_…|rk_…" or HTTP basic auth with the key as the
// user name, as Stripe does. The key itself is never logged.
func apiKeyCheck(r *http.Request) *apiError {
	auth := strings.TrimSpace(r.Header.Get("Authorization"))
	var key string
	switch {
	case auth == "":
		return errNoAPIKey()
	case strings.HasPrefix(auth, "Bearer "):
		key = strings.TrimSpace(strings.TrimPrefix(auth, "Bearer "))
	case strings.HasPrefix(auth, "Basic "):
		decoded, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth, "Basic "))
		if err != nil {
			return errInvalidAPIKey("")
		}
		key, _, _ = strings.Cut(string(decoded), ":")
	default:
		return errNoAPIKey()
	}
	if key == "" {
		return errNoAPIKey()
	}
	if !strings.HasPrefix(key, "sk_") && !strings.HasPrefix(key, "rk_") {
		return errInvalidAPIKey(key)
	}
	return nil
}

func (s *Server) handleUnrecognized(w http.ResponseWriter, r *http.Request, rs *requestState) {
	s.writeError(w, rs, errUnrecognizedURL(r.Method, r.URL.Path))
}

// latencyApply sleeps for the latency fault matching customer, if any (customer-specific
// first, then global; an empty customer matches only global faults). It reports false if ctx
// ended first.
func (s *Server) latencyApply(ctx context.Context, customer string) bool {
	s.mu.Lock()
	f, ok := s.faultTakeLocked(customer, faultKindIs(FaultKindLatency))
	s.mu.Unlock()
	if !ok {
		return true
	}
	s.logger.Info("fault applied", "kind", string(FaultKindLatency), "customer", customer, "latency_ms", f.Latency.Milliseconds())
	return sleepCtx(ctx, f.Latency)
}

// dropConnection counts the request, then closes the client connection without writing a
// response.
func dropConnection(w http.ResponseWriter, rs *requestState) {
	rs.countOnce()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // HTTP/2 or a writer that cannot hijack: abort the stream
	}
	_ = conn.Close()
}

// formParse parses the query string and a form-encoded body into one set of values, as Stripe
// accepts parameters in either.
func formParse(w http.ResponseWriter, r *http.Request) (url.Values, *apiError) {
	r.Body = http.MaxBytesReader(w, r.Body, formBodyLimit)
	if err := r.ParseForm(); err != nil {
		return nil, errParameterInvalid("", "", fmt.Sprintf("Invalid request: could not parse parameters: %v", err))
	}
	return r.Form, nil
}

func formBool(form url.Values, name string) (bool, *apiError) {
	switch raw := form.Get(name); raw {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, errParameterInvalid("", name, fmt.Sprintf("Invalid boolean: %s", raw))
	}
}

func (s *Server) writeError(w http.ResponseWriter, rs *requestState, e *apiError) {
	if e.RequestLogURL == "" {
		e.RequestLogURL = requestLogURL(rs.requestID)
	}
	if rs.outcome == "" {
		switch e.status {
		case http.StatusUnauthorized:
			rs.outcome = "unauthorized"
		case http.StatusNotFound:
			rs.outcome = "not_found"
		default:
			rs.outcome = "invalid_request"
		}
	}
	s.writeJSONBytes(w, e.status, mustJSON(apiErrorEnvelope{Error: e}))
}

func (s *Server) writeJSON(w http.ResponseWriter, status int, v any) {
	s.writeJSONBytes(w, status, mustJSON(v))
}

func (s *Server) writeJSONBytes(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// mustJSON marshals the simulator's own wire types, which cannot fail.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("stripesim: marshaling %T: %v", v, err))
	}
	return b
}

// decodeAs decodes a rendered wire object as stripe-go's type, as a client would see it.
func decodeAs[T any](body []byte, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	var out T
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("error decoding simulator object as %T: %w", out, err)
	}
	return &out, nil
}

func stringOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func copyMetadata(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
