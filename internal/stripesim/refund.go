package stripesim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/stripe/stripe-go/v76"
)

// refundStatusSucceeded is the status of every simulated refund: card refunds succeed at once.
const refundStatusSucceeded = "succeeded"

// refundReasons are the reasons a client may give, in Stripe's order.
var refundReasons = []string{"duplicate", "fraudulent", "requested_by_customer"}

// refund is a simulated Refund, rendered in Stripe's shape. Refunds never change once created,
// so the same value sits in Server.refunds and in its charge's refunds list.
type refund struct {
	seq int64 // creation order; breaks ties between refunds created in the same second

	ID                     string            `json:"id"`
	Object                 string            `json:"object"`
	Amount                 int64             `json:"amount"`
	BalanceTransaction     *string           `json:"balance_transaction"`
	Charge                 string            `json:"charge"`
	Created                int64             `json:"created"`
	Currency               string            `json:"currency"`
	Metadata               map[string]string `json:"metadata"`
	PaymentIntent          string            `json:"payment_intent"`
	Reason                 *string           `json:"reason"`
	ReceiptNumber          *string           `json:"receipt_number"`
	SourceTransferReversal *string           `json:"source_transfer_reversal"`
	Status                 string            `json:"status"`
	TransferReversal       *string           `json:"transfer_reversal"`
}

// refundCompareNewestFirst orders refunds newest first; refunds created in the same second are
// ordered by creation sequence, newest first, so paging is stable.
func refundCompareNewestFirst(a, b *refund) int {
	if c := cmp.Compare(b.Created, a.Created); c != 0 {
		return c
	}
	return cmp.Compare(b.seq, a.seq)
}

// refundCreateParams are the validated parameters of POST /v1/refunds.
type refundCreateParams struct {
	paymentIntent string
	amount        int64 // 0: everything not yet refunded
	reason        string
	metadata      map[string]string
}

// refundParamsLocked validates the create parameters the way Stripe does before it starts
// executing a request; an error here is answered 400 and is not stored under the idempotency
// key. Whether the PaymentIntent can be refunded is decided when the request executes
// (refundExecuteLocked). Parameters the simulator does not know (charge, currency,
// refund_application_fee, …) are ignored but still part of the idempotency fingerprint. s.mu
// must be held.
func (s *Server) refundParamsLocked(form url.Values) (*refundCreateParams, *apiError) {
	p := &refundCreateParams{paymentIntent: form.Get("payment_intent")}
	if p.paymentIntent == "" {
		return nil, errParameterMissing("payment_intent")
	}
	if _, ok := s.paymentIntentsByID[p.paymentIntent]; !ok {
		return nil, errReferenceMissing("payment_intent", "payment_intent", p.paymentIntent)
	}

	if raw := form.Get("amount"); raw != "" {
		amount, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || amount < 1 {
			return nil, errParameterInvalid("parameter_invalid_integer", "amount", fmt.Sprintf("Invalid positive integer: %s", raw))
		}
		p.amount = amount
	}

	p.reason = form.Get("reason")
	if p.reason != "" && !slices.Contains(refundReasons, p.reason) {
		return nil, errParameterInvalid("", "reason", fmt.Sprintf("Invalid reason: must be one of %s, or %s",
			strings.Join(refundReasons[:len(refundReasons)-1], ", "), refundReasons[len(refundReasons)-1]))
	}

	var apiErr *apiError
	if p.metadata, apiErr = formMetadata(form); apiErr != nil {
		return nil, apiErr
	}
	return p, nil
}

// refundExecuteLocked refunds the PaymentIntent's charge: it answers Stripe's 400 (stored under
// the key) when the PaymentIntent has no succeeded charge or the amount exceeds what is left,
// otherwise applies the refund's fault (if any), creates the refund through refundCreateLocked
// and renders the response. Faults are consumed only by refunds that can be made. s.mu must be
// held.
func (s *Server) refundExecuteLocked(p *refundCreateParams, requestID, idempotencyKey string) createResult {
	pi, ok := s.paymentIntentsByID[p.paymentIntent]
	if !ok { // only after a Reset since validation; the key's entry is gone too
		return createErrorResult(errReferenceMissing("payment_intent", "payment_intent", p.paymentIntent), requestID, "invalid_request")
	}
	ch := s.latestChargeLocked(pi)
	if pi.Status != paymentIntentStatusSucceeded || ch == nil || ch.Status != chargeStatusSucceeded {
		return createErrorResult(errPaymentIntentNotRefundable(pi.ID), requestID, "charge_not_refundable")
	}
	if e := refundCheck(ch, p.amount); e != nil {
		return createErrorResult(e, requestID, e.Code)
	}

	customerID := derefString(pi.Customer)
	fault, faulted := s.faultTakeLocked(customerID, faultKindAppliesToRefund)
	if faulted {
		s.logger.Info("fault applied", "kind", string(fault.Kind), "customer", customerID, "payment_intent", pi.ID,
			"request_id", requestID, "idempotency_key", idempotencyKey)
		if fault.Kind == FaultKindError500BeforeCreate {
			return createErrorResult(errInternal(), requestID, string(FaultKindError500BeforeCreate))
		}
	}

	re, apiErr := s.refundCreateLocked(ch, p, requestID, idempotencyKey)
	if apiErr != nil { // checked above; cannot happen
		return createErrorResult(apiErr, requestID, apiErr.Code)
	}
	result := createResult{status: http.StatusOK, body: mustJSON(re), outcome: "succeeded"}
	switch {
	case faulted && fault.Kind == FaultKindError500AfterCreate:
		return createErrorResult(errInternal(), requestID, string(FaultKindError500AfterCreate))
	case faulted && fault.Kind == FaultKindDropAfterCreate:
		result.outcome = "dropped"
		result.drop = true
	}
	return result
}

// refundCheck returns Stripe's 400 when amount (0: everything not yet refunded) cannot be
// refunded from ch: code charge_not_refundable for a charge that did not succeed,
// charge_already_refunded for a fully refunded one, amount_too_large for more than is left (or
// than the charge), parameter_invalid_integer for a negative amount. It returns nil when the
// refund can be made.
func refundCheck(ch *charge, amount int64) *apiError {
	left := ch.Amount - ch.AmountRefunded
	switch {
	case ch.Status != chargeStatusSucceeded:
		return newInvalidRequest(http.StatusBadRequest, "charge_not_refundable", "charge",
			fmt.Sprintf("Charge %s has status %s; only succeeded charges can be refunded.", ch.ID, ch.Status))
	case left <= 0:
		return newInvalidRequest(http.StatusBadRequest, "charge_already_refunded", "",
			fmt.Sprintf("Charge %s has already been refunded.", ch.ID))
	case amount < 0:
		return errParameterInvalid("parameter_invalid_integer", "amount", fmt.Sprintf("Invalid positive integer: %d", amount))
	case amount > ch.Amount:
		return newInvalidRequest(http.StatusBadRequest, "amount_too_large", "amount",
			fmt.Sprintf("Refund amount (%s) is greater than charge amount (%s)",
				formatAmount(amount, ch.Currency), formatAmount(ch.Amount, ch.Currency)))
	case amount > left:
		return newInvalidRequest(http.StatusBadRequest, "amount_too_large", "amount",
			fmt.Sprintf("Refund amount (%s) is greater than unrefunded amount on charge (%s)",
				formatAmount(amount, ch.Currency), formatAmount(left, ch.Currency)))
	}
	return nil
}

// errPaymentIntentNotRefundable is Stripe's answer to a refund of a PaymentIntent without a
// succeeded charge (processing, requires_action, declined, canceled, not confirmed).
func errPaymentIntentNotRefundable(paymentIntentID string) *apiError {
	return newInvalidRequest(http.StatusBadRequest, "charge_not_refundable", "payment_intent",
		fmt.Sprintf("This PaymentIntent (%s) does not have a successful charge to refund.", paymentIntentID))
}

// formatAmount renders minor units the way Stripe's refund messages do: "$7.01", "€7.01",
// "£7.01", or "7.01 CHF" for other currencies (every currency is treated as two-decimal).
func formatAmount(amount int64, currency string) string {
	value := fmt.Sprintf("%d.%02d", amount/100, amount%100)
	switch currency {
	case "usd":
		return "$" + value
	case "eur":
		return "€" + value
	case "gbp":
		return "£" + value
	}
	return value + " " + strings.ToUpper(currency)
}

// refundCreateLocked is the one place refunds are made, for POST /v1/refunds and the control
// API's ChargeRefund alike. It refunds p.amount (0: everything not yet refunded) of ch, which
// must pass refundCheck (otherwise its error is returned and nothing changes): it records a
// succeeded refund, updates the charge's amount_refunded, refunded and refunds list, counts it
// in Stats.RefundsCreated, and emits refund.created (data.object: the refund) then
// charge.refunded (data.object: the charge). requestID and idempotencyKey go into the events'
// request field; they are empty for control-API refunds. s.mu must be held.
func (s *Server) refundCreateLocked(ch *charge, p *refundCreateParams, requestID, idempotencyKey string) (*refund, *apiError) {
	if e := refundCheck(ch, p.amount); e != nil {
		return nil, e
	}
	amount := p.amount
	if amount == 0 {
		amount = ch.Amount - ch.AmountRefunded
	}
	metadata := p.metadata
	if metadata == nil {
		metadata = map[string]string{}
	}
	s.seq++
	re := &refund{
		seq:           s.seq,
		ID:            idRefund(),
		Object:        "refund",
		Amount:        amount,
		Charge:        ch.ID,
		Created:       s.nowLocked().Unix(),
		Currency:      ch.Currency,
		Metadata:      metadata,
		PaymentIntent: ch.PaymentIntent,
		Reason:        stringOrNil(p.reason),
		Status:        refundStatusSucceeded,
	}
	s.refunds = append(s.refunds, re)
	s.refundsByID[re.ID] = re
	s.stats.RefundsCreated++

	ch.AmountRefunded += amount
	ch.Refunded = ch.AmountRefunded == ch.Amount
	ch.Refunds.Data = append([]*refund{re}, ch.Refunds.Data...)
	ch.Refunds.TotalCount = len(ch.Refunds.Data)

	s.eventEmitLocked(eventTypeRefundCreated, re, requestID, idempotencyKey)
	s.eventEmitLocked(eventTypeChargeRefunded, ch, requestID, idempotencyKey)
	s.logger.Info("charge refunded", "charge", ch.ID, "refund", re.ID, "amount", amount,
		"request_id", requestID, "idempotency_key", idempotencyKey)
	return re, nil
}

func (s *Server) handleRefundCreate(w http.ResponseWriter, r *http.Request, rs *requestState) {
	s.handleCreate(w, r, rs, createOps{
		customerLocked: func(form url.Values) string {
			if pi, ok := s.paymentIntentsByID[form.Get("payment_intent")]; ok {
				return derefString(pi.Customer)
			}
			return ""
		},
		prepareLocked: func(form url.Values) (func(string, string) createResult, *apiError) {
			params, apiErr := s.refundParamsLocked(form)
			if apiErr != nil {
				return nil, apiErr
			}
			return func(requestID, idempotencyKey string) createResult {
				return s.refundExecuteLocked(params, requestID, idempotencyKey)
			}, nil
		},
	})
}

func (s *Server) handleRefundRetrieve(w http.ResponseWriter, r *http.Request, rs *requestState) {
	handleRetrieve(s, w, r, rs, "id", "refund", func(id string) (*refund, bool) {
		re, ok := s.refundsByID[id]
		return re, ok
	})
}

func (s *Server) handleRefundList(w http.ResponseWriter, r *http.Request, rs *requestState) {
	s.latencyApply(r.Context(), "")
	form, apiErr := formParse(w, r)
	if apiErr != nil {
		s.writeError(w, rs, apiErr)
		return
	}
	params, apiErr := listParamsParse(form)
	if apiErr != nil {
		s.writeError(w, rs, apiErr)
		return
	}
	paymentIntentID, chargeID := form.Get("payment_intent"), form.Get("charge")

	s.mu.Lock()
	defer s.mu.Unlock()

	if _, ok := s.paymentIntentsByID[paymentIntentID]; paymentIntentID != "" && !ok {
		s.writeError(w, rs, errReferenceMissing("payment_intent", "payment_intent", paymentIntentID))
		return
	}
	if _, ok := s.charges[chargeID]; chargeID != "" && !ok {
		s.writeError(w, rs, errReferenceMissing("charge", "charge", chargeID))
		return
	}
	var cursor *refund
	if param, id := params.cursor(); id != "" {
		re, ok := s.refundsByID[id]
		if !ok {
			s.writeError(w, rs, errReferenceMissing(param, "refund", id))
			return
		}
		cursor = re
	}

	matching := make([]*refund, 0, len(s.refunds))
	for _, re := range s.refunds {
		if paymentIntentID != "" && re.PaymentIntent != paymentIntentID {
			continue
		}
		if chargeID != "" && re.Charge != chargeID {
			continue
		}
		if !params.created.match(re.Created) {
			continue
		}
		matching = append(matching, re)
	}
	writeListPage(s, w, matching, cursor, params, refundCompareNewestFirst, "/v1/refunds")
}

// RefundList returns every refund the simulator made since the last Reset, oldest first:
// those created through POST /v1/refunds (including behind faulted responses: 500 after
// create, dropped connection) and through ChargeRefund. It is the ground truth for "refunded
// exactly once" assertions.
func (s *Server) RefundList() []*stripe.Refund {
	s.mu.Lock()
	body := mustJSON(append([]*refund{}, s.refunds...))
	s.mu.Unlock()
	out := []*stripe.Refund{}
	if err := json.Unmarshal(body, &out); err != nil {
		panic(fmt.Sprintf("stripesim: decoding own refunds: %v", err))
	}
	return out
}
