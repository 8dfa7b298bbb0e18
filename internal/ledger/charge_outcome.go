package ledger

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"
)

// Outcome is what one Stripe call returned, as the ledger records it.
type Outcome struct {
	Class                 OutcomeClass
	StripePaymentIntentID string
	StripeChargeID        string
	HTTPStatus            int
	StripeRequestID       string
	ErrorType             string
	ErrorCode             string
	ErrorMessage          string

	// ResolvedBy says what decided a final outcome: stripe_response (the
	// default), reconcile, webhook:<event id>.
	ResolvedBy string

	// HeldReason is why an OutcomeHeld holds the charge. Default
	// HeldUnexpectedStatus.
	HeldReason HeldReason
}

// chargeMayTake reports whether charge c may take an outcome o; transitions
// are monotonic. Pending and unknown take any outcome; processing only a
// final one. A failed or held charge takes only a success of the PaymentIntent
// it names (or, held, of the first one Stripe reports): Stripe says the money
// moved, so the ledger must too — except where the hold itself is about a
// conflicting PaymentIntent (a double charge, a mismatch), which stays for a
// human. An uncollectible charge is as a failed one; a past_due one takes the
// success (or processing) of its own PaymentIntent and a hold. Succeeded,
// skipped and canceled never change.
func chargeMayTake(c *Charge, o Outcome) bool {
	switch c.Status {
	case ChargePending, ChargeUnknown:
		return true
	case ChargeProcessing:
		return o.Class == OutcomeSucceeded || o.Class == OutcomeFailed || o.Class == OutcomeHeld
	case ChargeFailed, ChargeUncollectible:
		return o.Class == OutcomeSucceeded && c.StripePaymentIntentID != nil && *c.StripePaymentIntentID == o.StripePaymentIntentID
	case ChargePastDue:
		// Its declined PaymentIntent may still succeed (the customer
		// authenticated it) until a retry cancels it; a retry's listing may
		// find it held. A decline answered without its PaymentIntent
		// leaves the charge naming none: then the one the retry finds.
		own := o.StripePaymentIntentID != "" &&
			(c.StripePaymentIntentID == nil || *c.StripePaymentIntentID == o.StripePaymentIntentID)
		return ((o.Class == OutcomeSucceeded || o.Class == OutcomeProcessing) && own) || o.Class == OutcomeHeld
	case ChargeHeld:
		return o.Class == OutcomeSucceeded && o.StripePaymentIntentID != "" &&
			(c.HeldReason == nil || !c.HeldReason.Conflicting())
	}
	return false
}

// Applied is what applying an outcome did to a charge
// (chargeApplyOutcomeTx, ChargeReconcile).
type Applied struct {
	// Charge is the charge as stored after.
	Charge *Charge

	// Changed reports whether the charge's status changed.
	Changed bool

	// DoubleCharge is set when the outcome named a PaymentIntent other than
	// the one the charge names: money may have moved twice. The charge was
	// held if it was not final, and the alert is in its transitions either
	// way; it is logged as an ERROR line too.
	DoubleCharge *DoubleCharge
}

// DoubleCharge is a second PaymentIntent carrying a charge's key: money may
// have moved twice, and a human must look.
type DoubleCharge struct {
	ChargeID       int64
	PaymentIntents []string
}

// Alert says it in one line, for logs and the transitions log.
func (d *DoubleCharge) Alert() string {
	return fmt.Sprintf("ALERT double charge: charge %d has PaymentIntents %v", d.ChargeID, d.PaymentIntents)
}

// outcomeSource says who brings an outcome to chargeApplyOutcomeTx. It
// decides two things, each named by its own method: whether the outcome
// answers the claimant's own call (ownCall) and what becomes of the lease
// (lease).
type outcomeSource int

const (
	// outcomeFromClaimant is brought by the holder of the charge's lease,
	// through its Claim (ChargeRecordOutcome, ChargeRecordRetryPaid): what
	// its own Stripe calls (the create, its look-up, a retry's cancels)
	// answered for the key of the charge's current generation. The lease
	// is released, whatever the outcome does.
	outcomeFromClaimant outcomeSource = iota + 1

	// outcomeLearned is learned otherwise: a webhook, the reconciler, a
	// recovery, a guard. The lease stays with whoever holds it.
	outcomeLearned
)

// ownCall reports whether the outcome answers the claimant's own call.
func (s outcomeSource) ownCall() bool { return s == outcomeFromClaimant }

// lease is what applying the outcome does to the charge's lease.
func (s outcomeSource) lease() leaseAction {
	if s == outcomeFromClaimant {
		return leaseRelease
	}
	return leaseKeep
}

// leaseAction is what writing to a charge does to its lease.
type leaseAction int

const (
	// leaseKeep leaves the lease as it is.
	leaseKeep leaseAction = iota

	// leaseRelease clears the lease: its holder is done with the charge.
	leaseRelease
)

// chargeApplyOutcomeTx is the one way an outcome moves a charge: every path
// (the claimant's own call, the look-up, a webhook, the reconciler, the
// guards) goes through it, and from says whether the claimant brings it. It
// applies o to the locked charge c when c may take it (chargeMayTake). A
// PaymentIntent other than the one c names is never recorded over it: it is
// a double charge, which holds an unsettled charge and, on a settled one, is
// logged as an ALERT transition (status unchanged) for a human. News of a
// PaymentIntent a dunning retry canceled (Charge.Retired) moves nothing (an
// ALERT transition when it claims a success) — unless it is the answer to
// the claimant's own call (outcomeFromClaimant), whose key was then used
// before: held idempotency_error. An outcome from the claimant also clears
// the lease, whatever happens.
func (l *Ledger) chargeApplyOutcomeTx(ctx context.Context, tx *Tx, now time.Time, c *Charge, o Outcome, actor string, from outcomeSource) (Applied, error) {
	lease := from.lease()
	if pi := o.StripePaymentIntentID; c.Retired(pi) {
		if !from.ownCall() || !c.Status.Chargeable() {
			// News of a PaymentIntent a dunning retry canceled (a late,
			// replayed or reordered webhook): the retry saw it canceled,
			// and a canceled PaymentIntent never moves money again, so it
			// moves nothing. One that says it succeeded contradicts Stripe's
			// own record: a human looks.
			var alert Alert
			var msg string
			if o.Class == OutcomeSucceeded {
				alert = AlertRetiredPaymentIntentSucceeded
				msg = fmt.Sprintf("ALERT charge %d: PaymentIntent %s, canceled by a dunning retry, is reported succeeded", c.ID, pi)
			}
			return l.chargeUnmovedTx(ctx, tx, now, c, actor, alert, msg, lease)
		}
		// The claimant's own call, with the key of the charge's current
		// generation, answered with a PaymentIntent a retry canceled: the
		// key was used before (Tally's record of that was lost: a restore),
		// and calling again would replay the same answer. A human looks;
		// approving moves the charge to its next key generation.
		o = Outcome{Class: OutcomeHeld, HeldReason: HeldIdempotencyError, ErrorMessage: fmt.Sprintf(
			"key generation %d answered with PaymentIntent %s, which a dunning retry canceled: the key was used before", c.KeyGeneration, pi)}
	}
	if pi := o.StripePaymentIntentID; pi != "" && c.StripePaymentIntentID != nil && *c.StripePaymentIntentID != pi {
		double := &DoubleCharge{ChargeID: c.ID, PaymentIntents: []string{*c.StripePaymentIntentID, pi}}
		l.logger.ErrorContext(ctx, double.Alert(), AlertDoubleCharge.Attr(), "actor", actor, "outcome", string(o.Class))
		if (o.Class == OutcomeSucceeded || o.Class == OutcomeProcessing) && !c.Terminal() && c.Status != ChargeHeld {
			held, err := chargeWriteOutcomeTx(ctx, tx, now, c, ChargeHeld, nil, Outcome{
				Class: OutcomeHeld, HeldReason: HeldDoubleCharge, ErrorMessage: double.Alert(),
			}, actor, lease)
			if err != nil {
				return Applied{}, err
			}
			return Applied{Charge: held, Changed: true, DoubleCharge: double}, nil
		}
		c, err := chargeAlertTx(ctx, tx, now, c, actor, fmt.Sprintf("%s; Stripe says %s %s", double.Alert(), pi, o.Class), lease)
		if err != nil {
			return Applied{}, err
		}
		return Applied{Charge: c, DoubleCharge: double}, nil
	}
	if c.Status == ChargePastDue && o.Class == OutcomeProcessing && actorKind(actor) == ActorWebhook {
		// An event carries its PaymentIntent as it was when Stripe made the
		// event: a processing one delivered after the decline that made
		// the charge past_due is older news, and moving back to processing
		// would drop its retry. If the customer did complete it since, its
		// success (or failure) event settles the charge, and so does the
		// retry, which reads the PaymentIntent from Stripe itself.
		return l.chargeUnmovedTx(ctx, tx, now, c, actor, "", "", lease)
	}
	if !chargeMayTake(c, o) {
		var alert Alert
		var msg string
		if o.Class == OutcomeSucceeded && c.Terminal() && c.Status != ChargeSucceeded {
			// Money moved for a charge Tally settled without it (canceled,
			// failed, carried): never silent.
			alert = AlertSettledChargePaid
			msg = fmt.Sprintf("ALERT charge %d is %s but Stripe says PaymentIntent %s succeeded for it", c.ID, c.Status, o.StripePaymentIntentID)
		}
		return l.chargeUnmovedTx(ctx, tx, now, c, actor, alert, msg, lease)
	}
	next, err := chargeOutcomeStatus(c.Status, o)
	if err != nil {
		return Applied{}, err
	}
	var nextRetry *time.Time
	if next == ChargeFailed && DeclineRetryable(o) {
		next, nextRetry = l.dunningStatus(c, now)
		if next == ChargeFailed && o.ErrorCode == FailureNoPaymentMethod {
			next, o = ChargeHeld, noPaymentMethodHold(o)
		}
	}
	updated, err := chargeWriteOutcomeTx(ctx, tx, now, c, next, nextRetry, o, actor, lease)
	if err != nil {
		return Applied{}, err
	}
	return Applied{Charge: updated, Changed: updated.Status != c.Status}, nil
}

// chargeUnmovedTx leaves c's status as it is for an outcome it may not
// take: an ALERT line and transition (msg) when alert names one, and the
// lease cleared when lease is leaseRelease.
func (l *Ledger) chargeUnmovedTx(ctx context.Context, tx *Tx, now time.Time, c *Charge, actor string, alert Alert, msg string, lease leaseAction) (Applied, error) {
	var err error
	if alert != "" {
		l.logger.ErrorContext(ctx, msg, alert.Attr(), "actor", actor)
		c, err = chargeAlertTx(ctx, tx, now, c, actor, msg, lease)
	} else {
		c, err = chargeLeaseReleaseTx(ctx, tx, now, c, lease)
	}
	if err != nil {
		return Applied{}, err
	}
	return Applied{Charge: c}, nil
}

// chargeAlertTx logs an ALERT transition of c (status unchanged) with msg,
// an "ALERT …" line, and clears its lease when lease is leaseRelease.
func chargeAlertTx(ctx context.Context, tx *Tx, now time.Time, c *Charge, actor, msg string, lease leaseAction) (*Charge, error) {
	if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, c.Status, actor, msg); err != nil {
		return nil, err
	}
	return chargeLeaseReleaseTx(ctx, tx, now, c, lease)
}

// chargeLeaseReleaseTx clears the lease of c when lease is leaseRelease.
func chargeLeaseReleaseTx(ctx context.Context, tx *Tx, now time.Time, c *Charge, lease leaseAction) (*Charge, error) {
	if lease != leaseRelease {
		return c, nil
	}
	return scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET lease_owner = NULL, lease_expires_at = NULL, updated_at = $2
WHERE id = $1 RETURNING `+chargeColumns, c.ID, now))
}

// chargeOutcomeStatus is the status outcome o moves a charge in status from
// to (its own status when the class changes nothing).
func chargeOutcomeStatus(from ChargeStatus, o Outcome) (ChargeStatus, error) {
	switch o.Class {
	case OutcomeSucceeded:
		return ChargeSucceeded, nil
	case OutcomeFailed:
		return ChargeFailed, nil
	case OutcomeProcessing:
		return ChargeProcessing, nil
	case OutcomeUnknown:
		return ChargeUnknown, nil
	case OutcomeHeld:
		return ChargeHeld, nil
	case OutcomeRetryLater, OutcomeError:
		return from, nil
	}
	return "", fmt.Errorf("unknown outcome class %q", o.Class)
}

// chargeWriteOutcomeTx writes outcome o on the locked charge c, moving it to
// status next (chargeOutcomeStatus, or the dunning's past_due until
// nextRetry, or uncollectible): its PaymentIntent, failure or hold; it logs
// the transition and keeps the period's spend (chargeSpendTx); leaseRelease
// also clears its lease. Only chargeApplyOutcomeTx calls it, once it decided
// that c may take o.
func chargeWriteOutcomeTx(ctx context.Context, tx *Tx, now time.Time, c *Charge, next ChargeStatus, nextRetry *time.Time,
	o Outcome, actor string, lease leaseAction) (*Charge, error) {
	var resolvedBy, failureCode, failureMessage, heldDetail *string
	var heldReason *HeldReason
	switch o.Class {
	case OutcomeSucceeded, OutcomeFailed:
		resolvedBy = ptr(cmp.Or(o.ResolvedBy, "stripe_response"))
	case OutcomeHeld:
		heldReason = ptr(cmp.Or(o.HeldReason, HeldUnexpectedStatus))
		detail := o.ErrorMessage
		if prefix := strings.TrimSpace(o.ErrorType + " " + o.ErrorCode); prefix != "" {
			detail = prefix + ": " + detail
		}
		heldDetail = ptr(cmp.Or(strings.TrimSpace(detail), "held"))
	}
	if o.Class == OutcomeFailed { // failed, past_due or uncollectible
		failureCode = nullString(o.ErrorCode)
		failureMessage = nullString(o.ErrorMessage)
	}
	charge, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET status = $2,
    stripe_payment_intent_id = coalesce($3, stripe_payment_intent_id),
    stripe_charge_id = coalesce($4, stripe_charge_id),
    failure_code = coalesce($5, failure_code),
    failure_message = coalesce($6, failure_message),
    held_reason = coalesce($7, held_reason),
    held_detail = coalesce($8, held_detail),
    held_at = CASE WHEN $2 = 'held' AND status <> 'held' THEN $11 ELSE held_at END,
    resolved_by = coalesce($9, resolved_by),
    lease_owner = CASE WHEN $10 THEN NULL ELSE lease_owner END,
    lease_expires_at = CASE WHEN $10 THEN NULL ELSE lease_expires_at END,
    past_due_since = CASE WHEN $2 = 'past_due' THEN coalesce(past_due_since, $11) ELSE past_due_since END,
    next_retry_at = $12,
    cancel_requested_at = CASE WHEN $2 = 'past_due' THEN cancel_requested_at END,
    cancel_requested_by = CASE WHEN $2 = 'past_due' THEN cancel_requested_by END,
    cancel_reason = CASE WHEN $2 = 'past_due' THEN cancel_reason END,
    updated_at = $11
WHERE id = $1
RETURNING `+chargeColumns, c.ID, next, nullString(o.StripePaymentIntentID),
		nullString(o.StripeChargeID), failureCode, failureMessage, heldReason, heldDetail, resolvedBy, lease == leaseRelease, now, nextRetry))
	if err != nil {
		return nil, fmt.Errorf("error recording outcome: %w", err)
	}
	if next != c.Status {
		reason := o.ErrorCode
		if o.StripePaymentIntentID != "" {
			reason = strings.TrimSpace("payment_intent " + o.StripePaymentIntentID + " " + reason)
		}
		if heldReason != nil {
			reason = string(*heldReason) + ": " + *heldDetail
		}
		if nextRetry != nil {
			reason += fmt.Sprintf("; retry %d at %s", c.DunningRetries+1, nextRetry.UTC().Format(time.RFC3339))
		}
		if err := transitionTx(ctx, tx, now, charge.ID, charge.CustomerID, &c.Status, next, actor, reason); err != nil {
			return nil, err
		}
		if charge, err = chargeSpendTx(ctx, tx, charge); err != nil {
			return nil, err
		}
	}
	return charge, nil
}
