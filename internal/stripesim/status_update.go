package stripesim

import (
	"slices"

	"github.com/stripe/stripe-go/v76"
)

// Event types of refund and dispute status changes.
const (
	eventTypeChargeRefundUpdated  = "charge.refund.updated"
	eventTypeRefundUpdated        = "refund.updated"
	eventTypeChargeDisputeUpdated = "charge.dispute.updated"
	eventTypeChargeDisputeClosed  = "charge.dispute.closed"
)

// refundTransitions are the refund status changes Stripe makes: a pending
// refund (or one that requires action) succeeds, fails or is canceled, and a
// succeeded card refund can still fail (an expired or closed card).
var refundTransitions = map[string][]string{
	"requires_action": {"pending", "succeeded", "failed", "canceled"},
	"pending":         {"succeeded", "failed", "canceled"},
	"succeeded":       {"failed"},
}

// disputeTransitions are the dispute status changes Stripe makes: an
// inquiry (warning_…) goes under review, closes or escalates to a
// chargeback; a chargeback goes under review once evidence is submitted and
// is won or lost.
var disputeTransitions = map[string][]string{
	"warning_needs_response": {"warning_under_review", "warning_closed", "needs_response"},
	"warning_under_review":   {"warning_closed", "needs_response"},
	"needs_response":         {"under_review", "won", "lost"},
	"under_review":           {"won", "lost"},
}

// RefundUpdate moves a refund to status along Stripe's transitions (from
// requires_action or pending to succeeded, failed or canceled; from succeeded
// to failed) and emits refund.updated and charge.refund.updated, whose
// data.object is the refund, as Stripe does. A refund that fails or is
// canceled gives its amount back to the charge (amount_refunded, refunded).
// It returns the refund, or an error wrapping ErrNotFound (no such refund) or
// ErrConflict (a change Stripe does not make).
func (s *Server) RefundUpdate(refundID, status string) (*stripe.Refund, error) {
	return decodeAs[stripe.Refund](s.refundUpdate(refundID, status))
}

func (s *Server) refundUpdate(refundID, status string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	re, ok := s.refundsByID[refundID]
	if !ok {
		return nil, errorf(ErrNotFound, "no such refund: %q", refundID)
	}
	if !slices.Contains(refundTransitions[re.Status], status) {
		return nil, errorf(ErrConflict, "refund %s is %s; Stripe does not move it to %q", refundID, re.Status, status)
	}
	re.Status = status
	if ch, ok := s.charges[re.Charge]; ok && (status == "failed" || status == "canceled") {
		ch.AmountRefunded -= re.Amount
		ch.Refunded = ch.AmountRefunded == ch.Amount
	}
	s.eventEmitLocked(eventTypeRefundUpdated, re, "", "")
	s.eventEmitLocked(eventTypeChargeRefundUpdated, re, "", "")
	s.logger.Info("refund updated", "refund", re.ID, "status", status)
	return mustJSON(re), nil
}

// DisputeUpdate moves a dispute to status along Stripe's transitions
// (needs_response → under_review → won | lost, needs_response → won | lost;
// the inquiry statuses warning_needs_response → warning_under_review →
// warning_closed | needs_response) and emits charge.dispute.closed for won,
// lost and warning_closed, charge.dispute.updated otherwise, whose
// data.object is the dispute. It returns the dispute, or an error wrapping
// ErrNotFound (no such dispute) or ErrConflict (a change Stripe does not
// make).
func (s *Server) DisputeUpdate(disputeID, status string) (*stripe.Dispute, error) {
	return decodeAs[stripe.Dispute](s.disputeUpdate(disputeID, status))
}

func (s *Server) disputeUpdate(disputeID, status string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dp, ok := s.disputes[disputeID]
	if !ok {
		return nil, errorf(ErrNotFound, "no such dispute: %q", disputeID)
	}
	if !slices.Contains(disputeTransitions[dp.Status], status) {
		return nil, errorf(ErrConflict, "dispute %s is %s; Stripe does not move it to %q", disputeID, dp.Status, status)
	}
	dp.Status = status
	eventType := eventTypeChargeDisputeUpdated
	switch status {
	case "won", "lost", "warning_closed":
		eventType = eventTypeChargeDisputeClosed
	case "under_review", "warning_under_review":
		dp.EvidenceDetails.HasEvidence = true
		dp.EvidenceDetails.SubmissionCount++
	}
	s.eventEmitLocked(eventType, dp, "", "")
	s.logger.Info("dispute updated", "dispute", dp.ID, "status", status)
	return mustJSON(dp), nil
}
