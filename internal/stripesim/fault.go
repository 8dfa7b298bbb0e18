package stripesim

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
)

// FaultKind names one kind of injected fault. Unless stated otherwise (list_error_500) a fault matches only
// POST /v1/payment_intents requests whose customer parameter equals Fault.Customer, and
// POST /v1/refunds requests whose PaymentIntent belongs to that customer (or any such request
// when Fault.Customer is FaultCustomerAll). The kinds that apply to refunds are latency,
// error_500_before_create, error_500_after_create, drop_after_create and rate_limit; the
// others only shape PaymentIntent creations. A fault is consumed by whichever matching request
// comes first, PaymentIntent or refund.
type FaultKind string

const (
	// FaultKindLatency delays the answer by Fault.Latency. A global (FaultCustomerAll) latency
	// fault delays every /v1 endpoint; a per-customer one delays that customer's
	// PaymentIntent and refund creations. On POST /v1/payment_intents and POST /v1/refunds the
	// delay happens after the idempotency key is taken (a concurrent request with the same key
	// gets 409 idempotency_key_in_use) and before the request executes. If the client gives up during
	// the delay the simulator stops waiting and still executes the request and stores its
	// result under the key, as Stripe finishes a request whose client disconnected.
	FaultKindLatency FaultKind = "latency"

	// FaultKindError500BeforeCreate answers 500 api_error without creating anything. Because the
	// request began executing, the 500 is stored under the idempotency key and replayed to
	// retries with the same key until the key expires.
	FaultKindError500BeforeCreate FaultKind = "error_500_before_create"

	// FaultKindError500AfterCreate creates (and confirms) the PaymentIntent, or makes the
	// refund, then answers 500 api_error; the 500 is stored under the idempotency key. The
	// money moved although the client saw an error.
	FaultKindError500AfterCreate FaultKind = "error_500_after_create"

	// FaultKindDropAfterCreate creates (and confirms) the PaymentIntent, or makes the refund,
	// stores the success response under the idempotency key, then closes the connection
	// without answering, like a timeout after a server-side success. A retry with the same key
	// gets the stored success.
	FaultKindDropAfterCreate FaultKind = "drop_after_create"

	// FaultKindRateLimit answers 429 (code rate_limit) before anything else: nothing is created
	// and nothing is stored under the idempotency key.
	FaultKindRateLimit FaultKind = "rate_limit"

	// FaultKindDecline answers 402 card_error, code card_declined, with decline_code
	// Fault.DeclineCode (DeclineCodeDefault when empty). The PaymentIntent is created with
	// status requires_payment_method and last_payment_error, a failed charge is recorded, the
	// error embeds the PaymentIntent, and the 402 is stored under the idempotency key.
	// Matches only confirm=true requests.
	FaultKindDecline FaultKind = "decline"

	// FaultKindAuthenticationRequired answers 402 card_error, code authentication_required, as
	// Stripe does for an off-session payment whose bank requires 3-D Secure. The PaymentIntent
	// ends in requires_payment_method; the 402 is stored. Matches only confirm=true requests.
	FaultKindAuthenticationRequired FaultKind = "authentication_required"

	// FaultKindRequiresAction answers 200 with the PaymentIntent in status requires_action (the
	// customer must authenticate on-session); stored. Settle it with PaymentIntentSettle.
	// Matches only confirm=true requests.
	FaultKindRequiresAction FaultKind = "requires_action"

	// FaultKindProcessing answers 200 with the PaymentIntent in status processing, as for
	// asynchronous payment methods; stored. PaymentIntentSettle later moves it to succeeded or
	// failed and emits the matching webhook. Matches only confirm=true requests.
	FaultKindProcessing FaultKind = "processing"

	// FaultKindListError500 answers 500 api_error to GET /v1/payment_intents listing the
	// customer's PaymentIntents (every listing when Fault.Customer is FaultCustomerAll),
	// before anything is read. It matches only listings, never creations.
	FaultKindListError500 FaultKind = "list_error_500"
)

// FaultCustomerAll is the Fault.Customer value that matches every request.
const FaultCustomerAll = "*"

// DeclineCodeDefault is the decline code of a FaultKindDecline fault without one.
const DeclineCodeDefault = "generic_decline"

// faultKinds lists every known kind, in documentation order.
var faultKinds = []FaultKind{
	FaultKindLatency,
	FaultKindError500BeforeCreate,
	FaultKindError500AfterCreate,
	FaultKindDropAfterCreate,
	FaultKindRateLimit,
	FaultKindDecline,
	FaultKindAuthenticationRequired,
	FaultKindRequiresAction,
	FaultKindProcessing,
	FaultKindListError500,
}

// faultKindIsOutcome reports whether the kind decides the outcome of a PaymentIntent creation
// (as opposed to latency and rate_limit, which are checked separately).
func faultKindIsOutcome(k FaultKind) bool {
	switch k {
	case FaultKindError500BeforeCreate, FaultKindError500AfterCreate, FaultKindDropAfterCreate,
		FaultKindDecline, FaultKindAuthenticationRequired, FaultKindRequiresAction, FaultKindProcessing:
		return true
	}
	return false
}

// faultKindAppliesToRefund reports whether the kind decides the outcome of a refund creation
// (latency and rate_limit apply to refunds too but are checked separately). Faults are only
// taken for refunds that can be made; a refund refused by Stripe's rules leaves them in place.
func faultKindAppliesToRefund(k FaultKind) bool {
	switch k {
	case FaultKindError500BeforeCreate, FaultKindError500AfterCreate, FaultKindDropAfterCreate:
		return true
	}
	return false
}

// faultKindNeedsConfirm reports whether the kind only applies to confirm=true creations.
func faultKindNeedsConfirm(k FaultKind) bool {
	switch k {
	case FaultKindDecline, FaultKindAuthenticationRequired, FaultKindRequiresAction, FaultKindProcessing:
		return true
	}
	return false
}

// Fault is one injected fault. Adding a fault with the same Customer and Kind as an existing
// one replaces it. When several faults match a request, a customer-specific one wins over a
// FaultCustomerAll one, and older wins over newer.
type Fault struct {
	// Customer is the Stripe customer id ("cus_…") the fault applies to, or FaultCustomerAll.
	Customer string

	// Kind is what happens.
	Kind FaultKind

	// Count applies the fault to the next Count matching requests only; 0 means until
	// cleared. Read back from FaultList it is the number of applications left.
	Count int

	// Latency is the delay of a FaultKindLatency fault; required (> 0) for that kind and
	// ignored by the others. On the wire it is latency_ms.
	Latency time.Duration

	// DeclineCode is the decline_code of a FaultKindDecline fault; empty means
	// DeclineCodeDefault.
	DeclineCode string
}

type faultJSON struct {
	Customer    string    `json:"customer"`
	Kind        FaultKind `json:"kind"`
	Count       int       `json:"count,omitempty"`
	LatencyMS   int64     `json:"latency_ms,omitempty"`
	DeclineCode string    `json:"decline_code,omitempty"`
}

// MarshalJSON renders the fault in the control API's shape
// ({"customer","kind","count","latency_ms","decline_code"}).
func (f Fault) MarshalJSON() ([]byte, error) {
	return json.Marshal(faultJSON{
		Customer:    f.Customer,
		Kind:        f.Kind,
		Count:       f.Count,
		LatencyMS:   f.Latency.Milliseconds(),
		DeclineCode: f.DeclineCode,
	})
}

// UnmarshalJSON parses the control API's shape; unknown fields are an error.
func (f *Fault) UnmarshalJSON(data []byte) error {
	var v faultJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	*f = Fault{
		Customer:    v.Customer,
		Kind:        v.Kind,
		Count:       v.Count,
		Latency:     time.Duration(v.LatencyMS) * time.Millisecond,
		DeclineCode: v.DeclineCode,
	}
	return nil
}

func (f Fault) validate() error {
	if f.Customer != FaultCustomerAll && (!strings.HasPrefix(f.Customer, "cus_") || len(f.Customer) <= len("cus_")) {
		return errorf(ErrInvalid, `fault customer must be a Stripe customer id ("cus_…") or "*", got %q`, f.Customer)
	}
	known := false
	for _, k := range faultKinds {
		if f.Kind == k {
			known = true
			break
		}
	}
	if !known {
		return errorf(ErrInvalid, "unknown fault kind %q (known: %s)", f.Kind, faultKindsString())
	}
	if f.Count < 0 {
		return errorf(ErrInvalid, "fault count must be >= 0, got %d", f.Count)
	}
	if f.Kind == FaultKindLatency && f.Latency <= 0 {
		return errorf(ErrInvalid, "latency fault needs latency_ms > 0")
	}
	return nil
}

func faultKindsString() string {
	names := make([]string, len(faultKinds))
	for i, k := range faultKinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// FaultAdd adds a fault, replacing an existing one with the same Customer and Kind. It returns
// an error wrapping ErrInvalid for an unknown kind, a malformed customer, a negative count or a
// latency fault without latency.
func (s *Server) FaultAdd(f Fault) error {
	if err := f.validate(); err != nil {
		return err
	}
	if f.Kind == FaultKindDecline && f.DeclineCode == "" {
		f.DeclineCode = DeclineCodeDefault
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	replaced := false
	for i, existing := range s.faults {
		if existing.Customer == f.Customer && existing.Kind == f.Kind {
			s.faults[i] = &f
			replaced = true
			break
		}
	}
	if !replaced {
		s.faults = append(s.faults, &f)
	}
	s.logger.Info("fault set", "customer", f.Customer, "kind", string(f.Kind), "count", f.Count,
		"latency_ms", f.Latency.Milliseconds(), "decline_code", f.DeclineCode)
	return nil
}

// FaultClear removes every fault.
func (s *Server) FaultClear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
	s.logger.Info("faults cleared")
}

// FaultList returns the active faults, oldest first, with Count holding the applications left
// (0 for faults without a count).
func (s *Server) FaultList() []Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Fault, len(s.faults))
	for i, f := range s.faults {
		out[i] = *f
	}
	return out
}

// faultTakeLocked finds the fault that applies to a request for customer among those whose
// kind satisfies match, consumes one application of it, and returns it. Customer-specific
// faults win over FaultCustomerAll ones. s.mu must be held.
func (s *Server) faultTakeLocked(customer string, match func(FaultKind) bool) (Fault, bool) {
	for pass := 0; pass < 2; pass++ {
		for i, f := range s.faults {
			if !match(f.Kind) {
				continue
			}
			if pass == 0 && (customer == "" || f.Customer != customer) {
				continue
			}
			if pass == 1 && f.Customer != FaultCustomerAll {
				continue
			}
			taken := *f
			if f.Count > 0 {
				f.Count--
				if f.Count == 0 {
					s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
				}
			}
			return taken, true
		}
	}
	return Fault{}, false
}

func faultKindIs(kind FaultKind) func(FaultKind) bool {
	return func(k FaultKind) bool { return k == kind }
}
