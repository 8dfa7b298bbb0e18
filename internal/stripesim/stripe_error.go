package stripesim

import (
	"fmt"
	"net/http"
	"strings"
)

// Stripe error types (the "type" field of an error body).
const (
	errorTypeAPI            = "api_error"
	errorTypeCard           = "card_error"
	errorTypeIdempotency    = "idempotency_error"
	errorTypeInvalidRequest = "invalid_request_error"
)

// apiError is a Stripe API error body, rendered as {"error": {...}}. It is also the shape of a
// PaymentIntent's last_payment_error (with PaymentIntent left nil).
type apiError struct {
	status int

	Charge        string             `json:"charge,omitempty"`
	Code          string             `json:"code,omitempty"`
	DeclineCode   string             `json:"decline_code,omitempty"`
	DocURL        string             `json:"doc_url,omitempty"`
	Message       string             `json:"message"`
	Param         string             `json:"param,omitempty"`
	PaymentIntent *paymentIntent     `json:"payment_intent,omitempty"`
	PaymentMethod *paymentMethodWire `json:"payment_method,omitempty"`
	RequestLogURL string             `json:"request_log_url,omitempty"`
	Type          string             `json:"type"`
}

type apiErrorEnvelope struct {
	Error *apiError `json:"error"`
}

func docURL(code string) string {
	if code == "" {
		return ""
	}
	return "https://stripe.com/docs/error-codes/" + strings.ReplaceAll(code, "_", "-")
}

func newInvalidRequest(status int, code, param, message string) *apiError {
	return &apiError{
		status:  status,
		Code:    code,
		DocURL:  docURL(code),
		Message: message,
		Param:   param,
		Type:    errorTypeInvalidRequest,
	}
}

func errParameterMissing(param string) *apiError {
	return newInvalidRequest(http.StatusBadRequest, "parameter_missing", param,
		fmt.Sprintf("Missing required param: %s.", param))
}

func errParameterInvalid(code, param, message string) *apiError {
	return newInvalidRequest(http.StatusBadRequest, code, param, message)
}

func errResourceMissing(param, kind, id string) *apiError {
	return newInvalidRequest(http.StatusNotFound, "resource_missing", param,
		fmt.Sprintf("No such %s: '%s'", kind, id))
}

// errReferenceMissing is the 400 for a parameter naming an object that does not exist (a
// missing referenced object is a 400, not a 404).
func errReferenceMissing(param, kind, id string) *apiError {
	e := errResourceMissing(param, kind, id)
	e.status = http.StatusBadRequest
	return e
}

func errNoAPIKey() *apiError {
	return &apiError{
		status: http.StatusUnauthorized,
		Message: "You did not provide an API key. You need to provide your API key in the Authorization header, " +
			"using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY'). See https://stripe.com/docs/api#authentication " +
			"for details, or we can help at https://support.stripe.com/.",
		Type: errorTypeInvalidRequest,
	}
}

func errInvalidAPIKey(key string) *apiError {
	shown := key
	if len(shown) > 8 {
		shown = shown[:8]
	}
	return &apiError{
		status:  http.StatusUnauthorized,
		Message: fmt.Sprintf("Invalid API Key provided: %s***", shown),
		Type:    errorTypeInvalidRequest,
	}
}

func errIdempotencyMismatch(key string) *apiError {
	return &apiError{
		status: http.StatusBadRequest,
		Message: fmt.Sprintf("Keys for idempotent requests can only be used with the same parameters they were first used with. "+
			"Try using a key other than '%s' if you meant to execute a different request.", key),
		Type: errorTypeIdempotency,
	}
}

func errIdempotencyKeyInUse(key string) *apiError {
	return &apiError{
		status: http.StatusConflict,
		Code:   "idempotency_key_in_use",
		DocURL: docURL("idempotency_key_in_use"),
		Message: fmt.Sprintf("There is currently another in-progress request using this Idempotent Key (that probably means "+
			"you submitted twice, and the other request is still going through): %s. Please try again later.", key),
		Type: errorTypeInvalidRequest,
	}
}

func errRateLimit() *apiError {
	return &apiError{
		status:  http.StatusTooManyRequests,
		Code:    "rate_limit",
		DocURL:  docURL("rate_limit"),
		Message: "Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits.",
		Type:    errorTypeInvalidRequest,
	}
}

func errInternal() *apiError {
	return &apiError{
		status: http.StatusInternalServerError,
		Message: "Sorry, something went wrong. We've already been notified of the problem, but if you need any help, " +
			"you can reach out to support at https://support.stripe.com/contact.",
		Type: errorTypeAPI,
	}
}

func errUnrecognizedURL(method, path string) *apiError {
	return newInvalidRequest(http.StatusNotFound, "", "",
		fmt.Sprintf("Unrecognized request URL (%s: %s). Please see https://stripe.com/docs or we can help at https://support.stripe.com/.", method, path))
}

func requestLogURL(requestID string) string {
	return "https://dashboard.stripe.com/test/logs/" + requestID
}
