package stripesim

import (
	"fmt"
	"time"

	"github.com/stripe/stripe-go/v76"
)

// Charge statuses.
const (
	chargeStatusFailed    = "failed"
	chargeStatusPending   = "pending"
	chargeStatusSucceeded = "succeeded"
)

// refundListWire is a charge's embedded list of its refunds, newest first.
type refundListWire struct {
	Object     string    `json:"object"`
	Data       []*refund `json:"data"`
	HasMore    bool      `json:"has_more"`
	TotalCount int       `json:"total_count"`
	URL        string    `json:"url"`
}

// charge is a simulated Charge, rendered in Stripe's shape.
type charge struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountCaptured int64             `json:"amount_captured"`
	AmountRefunded int64             `json:"amount_refunded"`
	Captured       bool              `json:"captured"`
	Created        int64             `json:"created"`
	Currency       string            `json:"currency"`
	Customer       *string           `json:"customer"`
	Description    *string           `json:"description"`
	Disputed       bool              `json:"disputed"`
	FailureCode    *string           `json:"failure_code"`
	FailureMessage *string           `json:"failure_message"`
	Livemode       bool              `json:"livemode"`
	Metadata       map[string]string `json:"metadata"`
	Paid           bool              `json:"paid"`
	PaymentIntent  string            `json:"payment_intent"`
	PaymentMethod  string            `json:"payment_method"`
	Refunded       bool              `json:"refunded"`
	Refunds        refundListWire    `json:"refunds"`
	Status         string            `json:"status"`
}

type disputeEvidenceDetailsWire struct {
	DueBy           int64 `json:"due_by"`
	HasEvidence     bool  `json:"has_evidence"`
	PastDue         bool  `json:"past_due"`
	SubmissionCount int   `json:"submission_count"`
}

// dispute is a simulated Dispute, rendered in Stripe's shape.
type dispute struct {
	ID                 string                     `json:"id"`
	Object             string                     `json:"object"`
	Amount             int64                      `json:"amount"`
	Charge             string                     `json:"charge"`
	Created            int64                      `json:"created"`
	Currency           string                     `json:"currency"`
	EvidenceDetails    disputeEvidenceDetailsWire `json:"evidence_details"`
	IsChargeRefundable bool                       `json:"is_charge_refundable"`
	Livemode           bool                       `json:"livemode"`
	Metadata           map[string]string          `json:"metadata"`
	PaymentIntent      string                     `json:"payment_intent"`
	Reason             string                     `json:"reason"`
	Status             string                     `json:"status"`
}

// chargeNewLocked records a charge for the PaymentIntent in the given status. s.mu must be
// held.
func (s *Server) chargeNewLocked(pi *paymentIntent, status string, created int64) *charge {
	ch := &charge{
		ID:            idCharge(),
		Object:        "charge",
		Amount:        pi.Amount,
		Created:       created,
		Currency:      pi.Currency,
		Customer:      pi.Customer,
		Description:   pi.Description,
		Metadata:      copyMetadata(pi.Metadata),
		PaymentIntent: pi.ID,
		Refunds:       refundListWire{Object: "list", Data: []*refund{}},
	}
	if pi.PaymentMethod != nil {
		ch.PaymentMethod = *pi.PaymentMethod
	}
	ch.Refunds.URL = fmt.Sprintf("/v1/charges/%s/refunds", ch.ID)
	chargeSetStatus(ch, status, "", "")
	s.charges[ch.ID] = ch
	pi.LatestCharge = &ch.ID
	return ch
}

// chargeSetStatus moves a charge to status; failureCode and failureMessage apply to failed.
func chargeSetStatus(ch *charge, status, failureCode, failureMessage string) {
	ch.Status = status
	ch.FailureCode, ch.FailureMessage = nil, nil
	switch status {
	case chargeStatusSucceeded:
		ch.Paid, ch.Captured, ch.AmountCaptured = true, true, ch.Amount
	case chargeStatusPending:
		ch.Paid, ch.Captured, ch.AmountCaptured = false, true, ch.Amount
	case chargeStatusFailed:
		ch.Paid, ch.Captured, ch.AmountCaptured = false, false, 0
		ch.FailureCode, ch.FailureMessage = stringOrNil(failureCode), stringOrNil(failureMessage)
	}
}

// ChargeRefund refunds amount (in minor units) of a succeeded charge, or everything not yet
// refunded when amount is 0, as a refund made in Stripe's Dashboard would: the refund is made
// exactly as POST /v1/refunds makes it (listed by RefundList and GET /v1/refunds), and
// refund.created and charge.refunded are emitted. Faults do not apply. It returns the updated
// charge, or an error wrapping ErrNotFound (no such charge), ErrConflict (charge not succeeded
// or already fully refunded) or ErrInvalid (negative amount or more than is left).
func (s *Server) ChargeRefund(chargeID string, amount int64) (*stripe.Charge, error) {
	return decodeAs[stripe.Charge](s.chargeRefund(chargeID, amount))
}

func (s *Server) chargeRefund(chargeID string, amount int64) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.charges[chargeID]
	if !ok {
		return nil, errorf(ErrNotFound, "no such charge: %q", chargeID)
	}
	if _, apiErr := s.refundCreateLocked(ch, &refundCreateParams{amount: amount}, "", ""); apiErr != nil {
		sentinel := ErrInvalid
		if apiErr.Code == "charge_not_refundable" || apiErr.Code == "charge_already_refunded" {
			sentinel = ErrConflict
		}
		return nil, errorf(sentinel, "%s", apiErr.Message)
	}
	return mustJSON(ch), nil
}

// ChargeDispute opens a dispute (reason "fraudulent", status "needs_response") for the full
// amount of a succeeded charge and emits charge.dispute.created, whose data.object is the
// dispute, as on Stripe. It returns the dispute, or an error wrapping ErrNotFound (no such
// charge) or ErrConflict (charge not succeeded or already disputed).
func (s *Server) ChargeDispute(chargeID string) (*stripe.Dispute, error) {
	return decodeAs[stripe.Dispute](s.chargeDispute(chargeID))
}

func (s *Server) chargeDispute(chargeID string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.charges[chargeID]
	if !ok {
		return nil, errorf(ErrNotFound, "no such charge: %q", chargeID)
	}
	if ch.Status != chargeStatusSucceeded {
		return nil, errorf(ErrConflict, "charge %s has status %s; only succeeded charges can be disputed", chargeID, ch.Status)
	}
	if ch.Disputed {
		return nil, errorf(ErrConflict, "charge %s is already disputed", chargeID)
	}
	now := s.nowLocked()
	dp := &dispute{
		ID:       idDispute(),
		Object:   "dispute",
		Amount:   ch.Amount,
		Charge:   ch.ID,
		Created:  now.Unix(),
		Currency: ch.Currency,
		EvidenceDetails: disputeEvidenceDetailsWire{
			DueBy: now.Add(7 * 24 * time.Hour).Unix(),
		},
		Metadata:      map[string]string{},
		PaymentIntent: ch.PaymentIntent,
		Reason:        "fraudulent",
		Status:        "needs_response",
	}
	ch.Disputed = true
	s.disputes[dp.ID] = dp
	s.eventEmitLocked(eventTypeChargeDisputeCreated, dp, "", "")
	s.logger.Info("charge disputed", "charge", ch.ID, "dispute", dp.ID)
	return mustJSON(dp), nil
}
