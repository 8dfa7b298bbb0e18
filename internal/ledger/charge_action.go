package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Operator actions: the ways out of a hold (approve, cancel, resolve) and the
// kill switch, each recorded append-only in billing.operator_actions with who,
// when, why, and the charge's status before and after.

// Operator action names, as billing.operator_actions.action stores them.
const (
	ActionApprove        = "approve"
	ActionCancel         = "cancel"
	ActionResolve        = "resolve"
	ActionChargingPause  = "charging_pause"
	ActionChargingResume = "charging_resume"
	ActionLookupMark     = "lookup_mark"
	ActionRetry          = "retry"
)

// ReasonMaxChars bounds an operator's reason.
const ReasonMaxChars = 1000

// OperatorAction is one recorded operator action.
type OperatorAction struct {
	ID           int64
	Action       string
	ChargeID     *int64
	Actor        string
	Reason       string
	StatusBefore *ChargeStatus
	StatusAfter  *ChargeStatus
	Detail       map[string]any
	CreatedAt    time.Time
}

// checkReason returns a *ValidationError unless reason is 1 to
// ReasonMaxChars characters of text.
func checkReason(reason string) error {
	fe := fieldErrors{}
	switch n := utf8.RuneCountInString(strings.TrimSpace(reason)); {
	case n == 0:
		fe.add("reason", "is required: say why, in 1 to %d characters", ReasonMaxChars)
	case n > ReasonMaxChars || utf8.RuneCountInString(reason) > ReasonMaxChars:
		fe.add("reason", "is %d characters long; send at most %d", utf8.RuneCountInString(reason), ReasonMaxChars)
	case !utf8.ValidString(reason) || strings.ContainsRune(reason, 0):
		fe.add("reason", "must be valid UTF-8 text without NUL characters")
	}
	return fe.err()
}

// operatorActionTx appends an operator action and returns its id.
func operatorActionTx(ctx context.Context, tx *Tx, now time.Time, a OperatorAction) (int64, error) {
	if a.Detail == nil {
		a.Detail = map[string]any{}
	}
	detail, err := json.Marshal(a.Detail)
	if err != nil {
		return 0, err
	}
	var id int64
	err = tx.QueryRow(ctx, `
INSERT INTO billing.operator_actions (action, charge_id, actor, reason, status_before, status_after, detail, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id`,
		a.Action, a.ChargeID, a.Actor, a.Reason, a.StatusBefore, a.StatusAfter, detail, now).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("error recording operator action %s: %w", a.Action, err)
	}
	return id, nil
}

// operatorActionColumns are the columns of billing.operator_actions that
// scanOperatorAction reads, in its order.
const operatorActionColumns = `id, action, charge_id, actor, reason, status_before, status_after, detail, created_at`

// scanOperatorAction reads an OperatorAction from a row of
// operatorActionColumns.
func scanOperatorAction(row pgx.Row) (*OperatorAction, error) {
	var a OperatorAction
	err := row.Scan(&a.ID, &a.Action, &a.ChargeID, &a.Actor, &a.Reason, &a.StatusBefore, &a.StatusAfter, &a.Detail, &a.CreatedAt)
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// ChargeActions returns the operator actions on a charge, oldest first.
func (l *Ledger) ChargeActions(ctx context.Context, chargeID int64) ([]*OperatorAction, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+operatorActionColumns+`
FROM billing.operator_actions WHERE charge_id = $1 ORDER BY id`, chargeID)
	if err != nil {
		return nil, fmt.Errorf("error reading actions of charge %d: %w", chargeID, err)
	}
	actions, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*OperatorAction, error) { return scanOperatorAction(r) })
	if err != nil {
		return nil, fmt.Errorf("error reading actions of charge %d: %w", chargeID, err)
	}
	return actions, nil
}

// ChargeActionParams are the fields of ChargeApprove and ChargeCancel.
type ChargeActionParams struct {
	ChargeID int64

	// Actor is who acts: operator:<key name>/<key prefix> or cli:<os user>.
	Actor string

	// Reason says why, 1 to ReasonMaxChars characters. Required.
	Reason string
}

// chargeActionTx runs an operator action on the locked charge: act checks and
// changes it, and the action is recorded with the status before and after.
// It refuses (ConflictChargeLeased) while a worker holds the charge's lease:
// an action never races a Stripe call.
func (l *Ledger) chargeAction(ctx context.Context, action string, p ChargeActionParams, detail map[string]any,
	act func(tx *Tx, now time.Time, c *Charge) (*Charge, error)) (*Charge, error) {
	if err := checkReason(p.Reason); err != nil {
		return nil, err
	}
	var before, after *Charge
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		c, err := chargeLockTx(ctx, tx, p.ChargeID)
		if err != nil {
			return err
		}
		if c.LeaseLive() {
			return &ConflictError{Code: ConflictChargeLeased, Detail: fmt.Sprintf(
				"charge %d is being charged right now (lease held by %s until %s); try again after that",
				c.ID, *c.LeaseOwner, c.LeaseExpiresAt.Format(time.RFC3339))}
		}
		before = c
		if after, err = act(tx, now, c); err != nil {
			return err
		}
		_, err = operatorActionTx(ctx, tx, now, OperatorAction{Action: action, ChargeID: &c.ID, Actor: p.Actor,
			Reason: p.Reason, StatusBefore: &before.Status, StatusAfter: &after.Status, Detail: detail})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("error in %s of charge %d: %w", action, p.ChargeID, err)
	}
	l.logger.WarnContext(ctx, "operator action", "action", action, "charge_id", p.ChargeID, "actor", p.Actor,
		"reason", p.Reason, "status_before", string(before.Status), "status_after", string(after.Status))
	return after, nil
}

// ChargeApprove is the operator's way out of a hold: held → pending, marked
// approved (the guards — cap, budget, anomaly — are waived for it: that is the
// operator's explicit decision), marked for a look-up at Stripe before its next
// call when its key was already used (a never-called generation looks
// anyway), and its charge job runs now; it then charges with the same key
// rules as any charge. A charge held for idempotency_error (Stripe keeps its
// key with other parameters) moves to its next key generation. It refuses
// with ConflictChargeNotHeld a charge that is not held, or held for a double
// charge or a mismatching PaymentIntent
// (those are resolved: ChargeResolveRequest).
func (l *Ledger) ChargeApprove(ctx context.Context, p ChargeActionParams) (*Charge, error) {
	return l.chargeAction(ctx, ActionApprove, p, nil, func(tx *Tx, now time.Time, c *Charge) (*Charge, error) {
		if c.Status != ChargeHeld {
			return nil, &ConflictError{Code: ConflictChargeNotHeld, Detail: fmt.Sprintf("charge %d is %s; only a held charge can be approved", c.ID, c.Status)}
		}
		if c.HeldReason != nil && c.HeldReason.Conflicting() {
			return nil, &ConflictError{Code: ConflictChargeNotHeld, Detail: fmt.Sprintf(
				"charge %d is held for %s: money already moved for it; resolve it instead (POST /v1/charges/%d/resolve with keep_payment_intent)",
				c.ID, *c.HeldReason, c.ID)}
		}
		if c.HeldReason != nil && !c.HeldReason.Approvable() {
			return nil, &ConflictError{Code: ConflictChargeNotHeld, Detail: fmt.Sprintf(
				"charge %d is held for %s: Stripe refuses %d %s in one PaymentIntent (at most %d); cancel it and bill it outside Tally",
				c.ID, *c.HeldReason, c.AmountCents, c.Currency, AmountMaxCents)}
		}
		// Stripe keeps this key with other parameters: the next call needs
		// the next key generation. Safe: the request stored under the key has
		// finished (Stripe answered idempotency_error, not key in use), so the
		// look-up before the call sees any PaymentIntent it created.
		//
		// A charge Stripe refused for want of a payment method calls with
		// the one the customer has now (registered in Tally, else its
		// default on Stripe, looked up before the call), so with the next
		// key generation too.
		gen := c.KeyGeneration
		noPaymentMethod := c.HeldReason != nil && *c.HeldReason == HeldNoPaymentMethod
		if c.HeldReason != nil && *c.HeldReason == HeldIdempotencyError || noPaymentMethod {
			gen++
		}
		updated, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET status = 'pending', approved_at = $2, updated_at = $2,
    lookup_required = lookup_required OR ($3 = key_generation AND generation_first_attempted_at IS NOT NULL),
    held_reason = NULL, held_detail = NULL, held_at = NULL, held_alerted_at = NULL,
    key_generation = $3, idempotency_key = CASE WHEN $3 = key_generation THEN idempotency_key ELSE $4 END,
    generation_first_attempted_at = CASE WHEN $3 = key_generation THEN generation_first_attempted_at END,
    stripe_payment_method_id = CASE WHEN $5 THEN (
        SELECT cu.stripe_payment_method_id FROM billing.customers cu
        WHERE cu.customer_id = charges.customer_id AND cu.stripe_customer_id = charges.stripe_customer_id)
        ELSE stripe_payment_method_id END
WHERE id = $1 RETURNING `+chargeColumns, c.ID, now, gen, c.IdempotencyKeyFor(gen), noPaymentMethod))
		if err != nil {
			return nil, fmt.Errorf("error approving: %w", err)
		}
		if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, updated.Status, p.Actor, "approved: "+p.Reason); err != nil {
			return nil, err
		}
		if err := l.chargePeriodJobRunNowTx(ctx, tx, c); err != nil {
			return nil, err
		}
		return updated, nil
	})
}

// ChargeCancel cancels a held or pending charge for which Tally knows no money
// moved: no Stripe attempt, or every attempt finished with an outcome that
// moved nothing (failed, retry_later, error) and no PaymentIntent known. It
// releases the charge's budget reservation. It refuses with
// ConflictChargeOutcomeUnknown a charge whose money may have moved (reconcile
// it first), and with ConflictChargeNotCancelable any other status.
//
// A past_due charge (the customer left, the debt is written off) has
// PaymentIntents on Stripe that could still succeed: its cancel is recorded
// on the charge (CancelRequestedAt, By, Reason) and its charge job runs now,
// through the same claim, lease and kill switch as a retry. The job cancels
// on Stripe every PaymentIntent of the charge that could still succeed,
// then the charge (ChargeCancelFinish); one found paid meanwhile settles the
// charge instead. The charge returned is still past_due.
func (l *Ledger) ChargeCancel(ctx context.Context, p ChargeActionParams) (*Charge, error) {
	detail := map[string]any{}
	return l.chargeAction(ctx, ActionCancel, p, detail, func(tx *Tx, now time.Time, c *Charge) (*Charge, error) {
		if c.Status == ChargePastDue {
			detail["state"] = "requested"
			updated, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET cancel_requested_at = $2, cancel_requested_by = $3, cancel_reason = $4, next_retry_at = $2, updated_at = $2
WHERE id = $1 RETURNING `+chargeColumns, c.ID, now, p.Actor, p.Reason))
			if err != nil {
				return nil, fmt.Errorf("error requesting the cancel: %w", err)
			}
			if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, c.Status, p.Actor,
				"cancel requested (its PaymentIntents are canceled on Stripe first): "+p.Reason); err != nil {
				return nil, err
			}
			return updated, l.chargePeriodJobRunNowTx(ctx, tx, c)
		}
		if c.Status == ChargeUnknown || c.Status == ChargeProcessing {
			return nil, &ConflictError{Code: ConflictChargeOutcomeUnknown, Detail: fmt.Sprintf(
				"charge %d is %s: money may have moved; reconcile it first (billingctl reconcile --customer %s --period %s)",
				c.ID, c.Status, c.CustomerID, c.Period)}
		}
		if c.Status != ChargeHeld && c.Status != ChargePending {
			return nil, &ConflictError{Code: ConflictChargeNotCancelable, Detail: fmt.Sprintf(
				"charge %d is %s; only a held, pending or past_due charge can be canceled", c.ID, c.Status)}
		}
		var moved int
		if err := tx.QueryRow(ctx, `
SELECT count(*) FROM billing.charge_attempts
WHERE charge_id = $1 AND (finished_at IS NULL OR outcome IN ('succeeded', 'processing', 'unknown', 'held'))`,
			c.ID).Scan(&moved); err != nil {
			return nil, fmt.Errorf("error reading attempts: %w", err)
		}
		if moved > 0 || c.StripePaymentIntentID != nil || c.LookupRequired ||
			(c.HeldReason != nil && c.HeldReason.Conflicting()) {
			return nil, &ConflictError{Code: ConflictChargeOutcomeUnknown, Detail: fmt.Sprintf(
				"money may have moved for charge %d (a Stripe attempt with an unknown or successful outcome, or a PaymentIntent carrying its key); reconcile it first (billingctl reconcile --customer %s --period %s)",
				c.ID, c.CustomerID, c.Period)}
		}
		updated, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET status = 'canceled', updated_at = $2 WHERE id = $1 RETURNING `+chargeColumns, c.ID, now))
		if err != nil {
			return nil, fmt.Errorf("error canceling: %w", err)
		}
		if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, updated.Status, p.Actor, "canceled: "+p.Reason); err != nil {
			return nil, err
		}
		return chargeSpendTx(ctx, tx, updated)
	})
}

// ChargeResolveJob is what the resolve job of a double charge carries.
type ChargeResolveJob struct {
	ChargeID          int64  `json:"charge_id"`
	KeepPaymentIntent string `json:"keep_payment_intent"`
	Actor             string `json:"actor"`
	ActionID          int64  `json:"action_id"`
}

// ChargeResolveRequestParams are the fields of ChargeResolveRequest.
type ChargeResolveRequestParams struct {
	ChargeActionParams

	// KeepPaymentIntent is the PaymentIntent the charge keeps (pi_…); every
	// other succeeded PaymentIntent carrying the charge's key is refunded.
	KeepPaymentIntent string
}

// ChargeResolveRequest is the operator's way out of a double charge (or a
// mismatching PaymentIntent): it records the decision and inserts the resolve
// job, which refunds in full every other succeeded PaymentIntent carrying the
// charge's key and settles the charge as succeeded with the kept one
// (ChargeResolveSettle). The charge stays held until the job is done. A
// succeeded charge for which a second PaymentIntent turned up is resolved the
// same way, keeping its own. It refuses with ConflictChargeNotHeld any other
// charge.
func (l *Ledger) ChargeResolveRequest(ctx context.Context, p ChargeResolveRequestParams) (*Charge, error) {
	if !strings.HasPrefix(p.KeepPaymentIntent, "pi_") || !ValidID(p.KeepPaymentIntent) {
		return nil, &ValidationError{Fields: map[string]string{"keep_payment_intent": fmt.Sprintf(
			"must be the id of the PaymentIntent to keep, such as pi_123; got %q", p.KeepPaymentIntent)}}
	}
	if err := checkReason(p.Reason); err != nil {
		return nil, err
	}
	var after *Charge
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		c, err := chargeLockTx(ctx, tx, p.ChargeID)
		if err != nil {
			return err
		}
		switch {
		case c.Status == ChargeHeld && c.HeldReason != nil && c.HeldReason.Conflicting():
		case c.Status == ChargeSucceeded && c.StripePaymentIntentID != nil && *c.StripePaymentIntentID == p.KeepPaymentIntent:
			// A second PaymentIntent found after the charge succeeded (an
			// ALERT double charge transition): keep the charge's own,
			// refund the others.
		case c.Status == ChargeSucceeded:
			return &ConflictError{Code: ConflictChargeNotHeld, Detail: fmt.Sprintf(
				"charge %d succeeded with %s: a resolve of a settled charge keeps that PaymentIntent (keep_payment_intent %s) and refunds the others",
				c.ID, orDash(c.StripePaymentIntentID), orDash(c.StripePaymentIntentID))}
		default:
			return &ConflictError{Code: ConflictChargeNotHeld, Detail: fmt.Sprintf(
				"charge %d is %s; resolve is the exit from a double_charge or payment_intent_mismatch hold, or from a second PaymentIntent of a succeeded charge (approve or cancel the others)",
				c.ID, c.Status)}
		}
		id, err := operatorActionTx(ctx, tx, now, OperatorAction{Action: ActionResolve, ChargeID: &c.ID, Actor: p.Actor,
			Reason: p.Reason, StatusBefore: &c.Status, StatusAfter: &c.Status,
			Detail: map[string]any{"keep_payment_intent": p.KeepPaymentIntent, "state": "requested"}})
		if err != nil {
			return err
		}
		if _, err := l.config.Scheduler.ChargeResolveJobInsertTx(ctx, tx, ChargeResolveJob{
			ChargeID: c.ID, KeepPaymentIntent: p.KeepPaymentIntent, Actor: p.Actor, ActionID: id}); err != nil {
			return err
		}
		after = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error in resolve of charge %d: %w", p.ChargeID, err)
	}
	return after, nil
}

// ChargeResolveSettle finishes an operator's resolve: the held charge is
// settled as succeeded with the kept PaymentIntent (its Stripe charge id as
// given) once every other one is refunded (RefundRecord), in one committed
// transaction. A charge already settled by an earlier run is returned as it
// is.
func (l *Ledger) ChargeResolveSettle(ctx context.Context, job ChargeResolveJob, stripeChargeID string) (*Charge, error) {
	var charge *Charge
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		c, err := chargeLockTx(ctx, tx, job.ChargeID)
		if err != nil {
			return err
		}
		if c.Status != ChargeHeld { // settled by an earlier run, or a succeeded charge's own kept
			charge = c
			return nil
		}
		charge, err = scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET status = 'succeeded', stripe_payment_intent_id = $2, stripe_charge_id = coalesce($3, stripe_charge_id),
       resolved_by = $4, updated_at = $5
WHERE id = $1 RETURNING `+chargeColumns, c.ID, job.KeepPaymentIntent, nullString(stripeChargeID), job.Actor, now))
		if err != nil {
			return fmt.Errorf("error settling: %w", err)
		}
		if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, charge.Status, job.Actor,
			fmt.Sprintf("resolved: kept %s, refunded every other PaymentIntent carrying the key", job.KeepPaymentIntent)); err != nil {
			return err
		}
		if charge, err = chargeSpendTx(ctx, tx, charge); err != nil {
			return err
		}
		_, err = operatorActionTx(ctx, tx, now, OperatorAction{Action: ActionResolve, ChargeID: &c.ID, Actor: job.Actor,
			Reason: fmt.Sprintf("resolve %d carried out", job.ActionID), StatusBefore: &c.Status, StatusAfter: &charge.Status,
			Detail: map[string]any{"keep_payment_intent": job.KeepPaymentIntent, "state": "done", "request": job.ActionID}})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("error settling resolve of charge %d: %w", job.ChargeID, err)
	}
	return charge, nil
}

func orDash(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}
