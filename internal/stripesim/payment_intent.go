package stripesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
)

// PaymentIntent statuses.
const (
	paymentIntentStatusCanceled              = "canceled"
	paymentIntentStatusProcessing            = "processing"
	paymentIntentStatusRequiresAction        = "requires_action"
	paymentIntentStatusRequiresConfirmation  = "requires_confirmation"
	paymentIntentStatusRequiresPaymentMethod = "requires_payment_method"
	paymentIntentStatusSucceeded             = "succeeded"
)

// paymentIntentAmountMax is Stripe's largest amount for two-decimal currencies (eight digits).
const paymentIntentAmountMax = 99_999_999

type nextActionWire struct {
	Type         string         `json:"type"`
	UseStripeSDK map[string]any `json:"use_stripe_sdk,omitempty"`
}

// paymentIntent is a simulated PaymentIntent, rendered in Stripe's shape.
type paymentIntent struct {
	seq int64 // creation order; breaks ties between PaymentIntents created in the same second

	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountCapturable   int64             `json:"amount_capturable"`
	AmountReceived     int64             `json:"amount_received"`
	CanceledAt         *int64            `json:"canceled_at"`
	CancellationReason *string           `json:"cancellation_reason"`
	CaptureMethod      string            `json:"capture_method"`
	ClientSecret       string            `json:"client_secret"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Customer           *string           `json:"customer"`
	Description        *string           `json:"description"`
	LastPaymentError   *apiError         `json:"last_payment_error"`
	LatestCharge       *string           `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	NextAction         *nextActionWire   `json:"next_action"`
	PaymentMethod      *string           `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	SetupFutureUsage   *string           `json:"setup_future_usage"`
	Status             string            `json:"status"`
}

// paymentIntentCreateParams are the validated parameters of POST /v1/payment_intents.
type paymentIntentCreateParams struct {
	amount        int64
	confirm       bool
	currency      string
	customer      string
	description   string
	metadata      map[string]string
	offSession    bool
	paymentMethod string // explicit or the customer's default
}

var (
	currencyPattern    = regexp.MustCompile(`^[a-z]{3}$`)
	metadataKeyPattern = regexp.MustCompile(`^metadata\[(.*)\]$`)
)

// paymentIntentParamsLocked validates the create parameters the way Stripe does before it
// starts executing a request; an error here is answered 400 and is not stored under the
// idempotency key. Parameters the simulator does not know are ignored (but still part of the
// idempotency fingerprint). s.mu must be held (the customer's default payment method is read).
func (s *Server) paymentIntentParamsLocked(form url.Values) (*paymentIntentCreateParams, *apiError) {
	p := &paymentIntentCreateParams{}

	rawAmount := form.Get("amount")
	if rawAmount == "" {
		return nil, errParameterMissing("amount")
	}
	amount, err := strconv.ParseInt(rawAmount, 10, 64)
	if err != nil {
		return nil, errParameterInvalid("parameter_invalid_integer", "amount", fmt.Sprintf("Invalid integer: %s", rawAmount))
	}
	if amount < 1 {
		return nil, errParameterInvalid("amount_too_small", "amount", "This value must be greater than or equal to 1.")
	}
	if amount > paymentIntentAmountMax {
		return nil, errParameterInvalid("amount_too_large", "amount",
			fmt.Sprintf("Amount must be no more than %d.", paymentIntentAmountMax))
	}
	p.amount = amount

	rawCurrency := form.Get("currency")
	if rawCurrency == "" {
		return nil, errParameterMissing("currency")
	}
	p.currency = strings.ToLower(rawCurrency)
	if !currencyPattern.MatchString(p.currency) {
		return nil, errParameterInvalid("", "currency",
			fmt.Sprintf("Invalid currency: %s. Stripe currently supports these currencies: usd, eur, gbp, ….", rawCurrency))
	}
	if min := ledger.AmountMinCents(p.currency); p.amount < min {
		return nil, errParameterInvalid("amount_too_small", "amount",
			fmt.Sprintf("Amount must be at least %d in the smallest unit of %s.", min, p.currency))
	}

	var apiErr *apiError
	if p.confirm, apiErr = formBool(form, "confirm"); apiErr != nil {
		return nil, apiErr
	}
	if p.offSession, apiErr = formBool(form, "off_session"); apiErr != nil {
		return nil, apiErr
	}
	if p.offSession && !p.confirm {
		return nil, errParameterInvalid("", "off_session",
			"You may only specify `off_session` when confirming the PaymentIntent (`confirm=true`).")
	}

	p.description = form.Get("description")
	if len(p.description) > 1000 {
		return nil, errParameterInvalid("", "description", "Invalid string: must be at most 1000 characters.")
	}

	if p.metadata, apiErr = formMetadata(form); apiErr != nil {
		return nil, apiErr
	}

	p.customer = form.Get("customer")
	var cust *customer
	if p.customer != "" {
		if cust = s.customerGetLocked(p.customer); cust == nil {
			e := errResourceMissing("customer", "customer", p.customer)
			e.status = http.StatusBadRequest // a missing referenced object is a 400, not a 404
			return nil, e
		}
	}

	p.paymentMethod = form.Get("payment_method")
	if p.paymentMethod != "" && !paymentMethodIDValid(p.paymentMethod) {
		e := errResourceMissing("payment_method", "PaymentMethod", p.paymentMethod)
		e.status = http.StatusBadRequest
		return nil, e
	}
	if p.paymentMethod == "" && cust != nil {
		p.paymentMethod = cust.defaultPaymentMethod
	}
	if p.confirm && p.paymentMethod == "" {
		message := "You cannot confirm this PaymentIntent because it's missing a payment method. You can either " +
			"update the PaymentIntent with a payment method and then confirm it again, or confirm it again directly " +
			"with a payment method."
		if p.customer != "" {
			message = "You cannot confirm this PaymentIntent because it's missing a payment method, and customer " +
				p.customer + " has no default payment method (invoice_settings.default_payment_method). Specify a " +
				"payment method attached to this customer along with the customer ID."
		}
		return nil, &apiError{
			status:  http.StatusBadRequest,
			Code:    "payment_intent_unexpected_state",
			DocURL:  docURL("payment_intent_unexpected_state"),
			Message: message,
			Param:   "payment_method",
			Type:    errorTypeInvalidRequest,
		}
	}
	return p, nil
}

// formMetadata parses the metadata[…] parameters as Stripe validates them: keys of 1 to 40
// characters, values of at most 500, at most 50 keys; an empty value unsets (here: omits) the
// key.
func formMetadata(form url.Values) (map[string]string, *apiError) {
	metadata := map[string]string{}
	for key, values := range form {
		m := metadataKeyPattern.FindStringSubmatch(key)
		if m == nil {
			continue
		}
		k, v := m[1], values[len(values)-1]
		switch {
		case k == "":
			return nil, errParameterInvalid("", "metadata", "Metadata keys must not be empty.")
		case len(k) > 40:
			return nil, errParameterInvalid("", "metadata",
				fmt.Sprintf("Metadata key '%s' is too long: keys can be at most 40 characters.", k))
		case len(v) > 500:
			return nil, errParameterInvalid("", "metadata",
				fmt.Sprintf("Metadata value for key '%s' is too long: values can be at most 500 characters.", k))
		case v == "":
			continue // an empty value unsets the key
		}
		metadata[k] = v
	}
	if len(metadata) > 50 {
		return nil, errParameterInvalid("", "metadata", "Metadata can have at most 50 keys.")
	}
	return metadata, nil
}

// paymentIntentExecuteLocked applies the outcome fault (if any), creates the PaymentIntent and
// its charge, emits events and renders the response. s.mu must be held.
func (s *Server) paymentIntentExecuteLocked(p *paymentIntentCreateParams, requestID, idempotencyKey string) createResult {
	fault, faulted := s.faultTakeLocked(p.customer, func(k FaultKind) bool {
		return faultKindIsOutcome(k) && (p.confirm || !faultKindNeedsConfirm(k))
	})
	if faulted {
		s.logger.Info("fault applied", "kind", string(fault.Kind), "customer", p.customer,
			"request_id", requestID, "idempotency_key", idempotencyKey)
	}
	if faulted && fault.Kind == FaultKindError500BeforeCreate {
		return createErrorResult(errInternal(), requestID, string(FaultKindError500BeforeCreate))
	}

	now := s.nowLocked().Unix()
	s.seq++
	pi := &paymentIntent{
		seq:                s.seq,
		ID:                 idPaymentIntent(),
		Object:             "payment_intent",
		Amount:             p.amount,
		CaptureMethod:      "automatic",
		ConfirmationMethod: "automatic",
		Created:            now,
		Currency:           p.currency,
		Customer:           stringOrNil(p.customer),
		Description:        stringOrNil(p.description),
		Metadata:           p.metadata,
		PaymentMethod:      stringOrNil(p.paymentMethod),
		PaymentMethodTypes: []string{"card"},
	}
	pi.ClientSecret = pi.ID + "_secret_" + idSecret()
	s.paymentIntents = append(s.paymentIntents, pi)
	s.paymentIntentsByID[pi.ID] = pi
	s.stats.PaymentIntentsCreated++

	result := createResult{status: http.StatusOK}
	switch {
	case !p.confirm:
		pi.Status = paymentIntentStatusRequiresPaymentMethod
		if p.paymentMethod != "" {
			pi.Status = paymentIntentStatusRequiresConfirmation
		}
		result.outcome = "created"

	case faulted && (fault.Kind == FaultKindDecline || fault.Kind == FaultKindAuthenticationRequired):
		code, declineCode, message := "card_declined", fault.DeclineCode, declineMessage(fault.DeclineCode)
		result.outcome = "declined"
		if fault.Kind == FaultKindAuthenticationRequired {
			code, declineCode = "authentication_required", "authentication_required"
			message = "Your card was declined. This transaction requires authentication."
			result.outcome = "authentication_required"
		}
		pm := paymentMethodNew(p.paymentMethod, p.customer, now)
		ch := s.chargeNewLocked(pi, chargeStatusFailed, now)
		chargeSetStatus(ch, chargeStatusFailed, code, message)
		pi.Status = paymentIntentStatusRequiresPaymentMethod
		pi.PaymentMethod = nil // Stripe detaches the failed payment method from the PaymentIntent
		pi.LastPaymentError = &apiError{
			Charge:        ch.ID,
			Code:          code,
			DeclineCode:   declineCode,
			DocURL:        docURL(code),
			Message:       message,
			PaymentMethod: pm,
			Type:          errorTypeCard,
		}
		s.eventEmitLocked(eventTypePaymentIntentPaymentFailed, pi, requestID, idempotencyKey)
		errBody := *pi.LastPaymentError
		errBody.status = http.StatusPaymentRequired
		errBody.PaymentIntent = pi
		return createErrorResult(&errBody, requestID, result.outcome)

	case faulted && fault.Kind == FaultKindRequiresAction:
		pi.Status = paymentIntentStatusRequiresAction
		pi.NextAction = &nextActionWire{
			Type:         "use_stripe_sdk",
			UseStripeSDK: map[string]any{"type": "three_d_secure_redirect", "stripe_js": "https://hooks.stripe.com/3d_secure_2/hosted"},
		}
		result.outcome = "requires_action"
		s.eventEmitLocked(eventTypePaymentIntentRequiresAction, pi, requestID, idempotencyKey)

	case faulted && fault.Kind == FaultKindProcessing:
		s.chargeNewLocked(pi, chargeStatusPending, now)
		pi.Status = paymentIntentStatusProcessing
		result.outcome = "processing"
		s.eventEmitLocked(eventTypePaymentIntentProcessing, pi, requestID, idempotencyKey)

	default: // no fault, error_500_after_create, drop_after_create
		s.chargeNewLocked(pi, chargeStatusSucceeded, now)
		pi.Status = paymentIntentStatusSucceeded
		pi.AmountReceived = pi.Amount
		result.outcome = "succeeded"
		s.eventEmitLocked(eventTypePaymentIntentSucceeded, pi, requestID, idempotencyKey)
	}

	result.body = mustJSON(pi)
	switch {
	case faulted && fault.Kind == FaultKindError500AfterCreate:
		return createErrorResult(errInternal(), requestID, string(FaultKindError500AfterCreate))
	case faulted && fault.Kind == FaultKindDropAfterCreate:
		result.outcome = "dropped"
		result.drop = true
	}
	return result
}

func declineMessage(declineCode string) string {
	switch declineCode {
	case "insufficient_funds":
		return "Your card has insufficient funds."
	case "expired_card":
		return "Your card has expired."
	default:
		return "Your card was declined."
	}
}

func (s *Server) handlePaymentIntentCreate(w http.ResponseWriter, r *http.Request, rs *requestState) {
	s.handleCreate(w, r, rs, createOps{
		customerLocked: func(form url.Values) string { return form.Get("customer") },
		prepareLocked: func(form url.Values) (func(string, string) createResult, *apiError) {
			params, apiErr := s.paymentIntentParamsLocked(form)
			if apiErr != nil {
				return nil, apiErr
			}
			return func(requestID, idempotencyKey string) createResult {
				return s.paymentIntentExecuteLocked(params, requestID, idempotencyKey)
			}, nil
		},
	})
}

func (s *Server) handlePaymentIntentRetrieve(w http.ResponseWriter, r *http.Request, rs *requestState) {
	handleRetrieve(s, w, r, rs, "intent", "payment_intent", func(id string) (*paymentIntent, bool) {
		pi, ok := s.paymentIntentsByID[id]
		return pi, ok
	})
}

// handleRetrieve answers the GET of one object by its path id: latency
// faults first, then the object that lookupLocked (called under s.mu) finds,
// or 404 resource_missing naming param and kind.
func handleRetrieve[T any](s *Server, w http.ResponseWriter, r *http.Request, rs *requestState, param, kind string,
	lookupLocked func(id string) (T, bool)) {
	s.latencyApply(r.Context(), "")
	id := r.PathValue("id")
	s.mu.Lock()
	obj, ok := lookupLocked(id)
	var body []byte
	if ok {
		body = mustJSON(obj)
	}
	s.mu.Unlock()
	if !ok {
		s.writeError(w, rs, errResourceMissing(param, kind, id))
		return
	}
	s.writeJSONBytes(w, http.StatusOK, body)
}

// PaymentIntentList returns every PaymentIntent the simulator created since the last Reset,
// oldest first, including those created behind a faulted response (500 after create, dropped
// connection, decline). It is the ground truth for "charged exactly once" assertions.
func (s *Server) PaymentIntentList() []*stripe.PaymentIntent {
	s.mu.Lock()
	body := mustJSON(append([]*paymentIntent{}, s.paymentIntents...))
	s.mu.Unlock()
	out := []*stripe.PaymentIntent{}
	if err := json.Unmarshal(body, &out); err != nil {
		panic(fmt.Sprintf("stripesim: decoding own PaymentIntents: %v", err))
	}
	return out
}

// SettleStatus is the final state PaymentIntentSettle moves a PaymentIntent to.
type SettleStatus string

const (
	// SettleStatusSucceeded completes a processing or requires_action PaymentIntent and emits
	// payment_intent.succeeded.
	SettleStatusSucceeded SettleStatus = "succeeded"

	// SettleStatusFailed fails a processing or requires_action PaymentIntent: it goes back to
	// requires_payment_method with a last_payment_error, and payment_intent.payment_failed is
	// emitted.
	SettleStatusFailed SettleStatus = "failed"

	// SettleStatusCanceled cancels a PaymentIntent in requires_payment_method,
	// requires_confirmation or requires_action and emits payment_intent.canceled.
	SettleStatusCanceled SettleStatus = "canceled"
)

// PaymentIntentSettleParams are the parameters of PaymentIntentSettle.
type PaymentIntentSettleParams struct {
	// Status is where the PaymentIntent goes. Required.
	Status SettleStatus `json:"status"`

	// DeclineCode is the last_payment_error.decline_code of a failed settlement of a
	// processing PaymentIntent. Empty means DeclineCodeDefault.
	DeclineCode string `json:"decline_code,omitempty"`
}

// PaymentIntentSettle finishes an asynchronous PaymentIntent, as the bank or the customer
// eventually would, emits the matching event and returns the updated PaymentIntent. It returns
// an error wrapping ErrNotFound (no such PaymentIntent), ErrInvalid (unknown status) or
// ErrConflict (the transition is not possible from the current status, e.g. settling a
// succeeded PaymentIntent). Stored idempotent responses are not changed: a retry with the
// original key still replays the original (e.g. processing) response, as on Stripe.
func (s *Server) PaymentIntentSettle(id string, params PaymentIntentSettleParams) (*stripe.PaymentIntent, error) {
	return decodeAs[stripe.PaymentIntent](s.paymentIntentSettle(id, params))
}

func (s *Server) paymentIntentSettle(id string, params PaymentIntentSettleParams) ([]byte, error) {
	switch params.Status {
	case SettleStatusSucceeded, SettleStatusFailed, SettleStatusCanceled:
	default:
		return nil, errorf(ErrInvalid, "settle status must be succeeded, failed or canceled, got %q", params.Status)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pi, ok := s.paymentIntentsByID[id]
	if !ok {
		return nil, errorf(ErrNotFound, "no such payment_intent: %q", id)
	}
	now := s.nowLocked().Unix()
	from := pi.Status
	conflict := func() error {
		return errorf(ErrConflict, "payment_intent %s has status %s; cannot settle it as %s", id, from, params.Status)
	}
	switch params.Status {
	case SettleStatusSucceeded:
		if from != paymentIntentStatusProcessing && from != paymentIntentStatusRequiresAction {
			return nil, conflict()
		}
		ch := s.latestChargeLocked(pi)
		if ch == nil {
			ch = s.chargeNewLocked(pi, chargeStatusSucceeded, now)
		}
		chargeSetStatus(ch, chargeStatusSucceeded, "", "")
		pi.Status = paymentIntentStatusSucceeded
		pi.AmountReceived = pi.Amount
		pi.NextAction = nil
		pi.LastPaymentError = nil
		s.eventEmitLocked(eventTypePaymentIntentSucceeded, pi, "", "")

	case SettleStatusFailed:
		if from != paymentIntentStatusProcessing && from != paymentIntentStatusRequiresAction {
			return nil, conflict()
		}
		pm := paymentMethodNew(derefString(pi.PaymentMethod), derefString(pi.Customer), now)
		lpe := &apiError{PaymentMethod: pm}
		if from == paymentIntentStatusRequiresAction {
			lpe.Code = "payment_intent_authentication_failure"
			lpe.Message = "The provided PaymentMethod has failed authentication. You can provide payment_method_data " +
				"or a new PaymentMethod to attempt to fulfill this PaymentIntent again."
			lpe.Type = errorTypeInvalidRequest
		} else {
			declineCode := params.DeclineCode
			if declineCode == "" {
				declineCode = DeclineCodeDefault
			}
			lpe.Code, lpe.DeclineCode, lpe.Message, lpe.Type = "card_declined", declineCode, declineMessage(declineCode), errorTypeCard
		}
		lpe.DocURL = docURL(lpe.Code)
		if ch := s.latestChargeLocked(pi); ch != nil {
			chargeSetStatus(ch, chargeStatusFailed, lpe.Code, lpe.Message)
			lpe.Charge = ch.ID
		}
		pi.Status = paymentIntentStatusRequiresPaymentMethod
		pi.PaymentMethod = nil
		pi.NextAction = nil
		pi.LastPaymentError = lpe
		s.eventEmitLocked(eventTypePaymentIntentPaymentFailed, pi, "", "")

	case SettleStatusCanceled:
		if !paymentIntentCancelable(from) {
			return nil, conflict()
		}
		reason := "automatic"
		s.paymentIntentCancelLocked(pi, &reason, now)
	}
	s.logger.Info("payment intent settled", "payment_intent", id, "from", from, "to", pi.Status)
	return mustJSON(pi), nil
}

// paymentIntentCancelable reports whether a PaymentIntent in status can be
// canceled (of the statuses the simulator uses).
func paymentIntentCancelable(status string) bool {
	return status == paymentIntentStatusRequiresPaymentMethod || status == paymentIntentStatusRequiresConfirmation ||
		status == paymentIntentStatusRequiresAction
}

// paymentIntentCancelLocked cancels pi (cancelable) with reason and emits
// payment_intent.canceled.
func (s *Server) paymentIntentCancelLocked(pi *paymentIntent, reason *string, now int64) {
	pi.Status = paymentIntentStatusCanceled
	pi.CanceledAt = &now
	pi.CancellationReason = reason
	pi.NextAction = nil
	s.eventEmitLocked(eventTypePaymentIntentCanceled, pi, "", "")
}

// handlePaymentIntentCancel is POST /v1/payment_intents/{id}/cancel: a
// PaymentIntent that has not succeeded nor started processing is canceled
// (for good: it can never succeed after); any other answers 400
// payment_intent_unexpected_state, as Stripe does. Latency faults apply.
func (s *Server) handlePaymentIntentCancel(w http.ResponseWriter, r *http.Request, rs *requestState) {
	s.latencyApply(r.Context(), "")
	id := r.PathValue("id")
	s.mu.Lock()
	pi, ok := s.paymentIntentsByID[id]
	var body []byte
	var status string
	if ok {
		status = pi.Status
		if paymentIntentCancelable(status) {
			var reason *string
			if v := r.PostFormValue("cancellation_reason"); v != "" {
				reason = &v
			}
			s.paymentIntentCancelLocked(pi, reason, s.nowLocked().Unix())
			body = mustJSON(pi)
		}
	}
	s.mu.Unlock()
	switch {
	case !ok:
		s.writeError(w, rs, errResourceMissing("intent", "payment_intent", id))
	case body == nil:
		s.writeError(w, rs, newInvalidRequest(http.StatusBadRequest, "payment_intent_unexpected_state", "",
			fmt.Sprintf("You cannot cancel this PaymentIntent because it has a status of %s. Only a PaymentIntent with one of the "+
				"following statuses may be canceled: requires_payment_method, requires_capture, requires_confirmation, requires_action, processing.", status)))
	default:
		s.logger.Info("payment intent canceled", "payment_intent", id, "from", status)
		s.writeJSONBytes(w, http.StatusOK, body)
	}
}

func (s *Server) latestChargeLocked(pi *paymentIntent) *charge {
	if pi.LatestCharge == nil {
		return nil
	}
	return s.charges[*pi.LatestCharge]
}
