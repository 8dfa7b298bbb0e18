package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Dunning. A charge that Stripe declined for a reason a later try can fix
// (DeclineRetryable) becomes past_due instead of failed while its schedule
// (Config.DunningSchedule: offsets from its first decline) has a retry left,
// and uncollectible when the last retry is declined too. A retry is the charge
// job run again at NextRetryAt (ChargeRetriesDue finds them; ChargeRetryNow
// asks for one at once): it claims the past_due charge (Claim.Retry), cancels
// on Stripe every PaymentIntent of the charge that could still succeed, then
// ChargeRetryBegin moves the charge to its next key generation with the
// customer's current payment method, and the call goes on as any charge's.
// A canceled PaymentIntent never succeeds, so a charge has at most one
// succeeded PaymentIntent whatever its retries.

// DunningScheduleDefault is TALLY_DUNNING_SCHEDULE's default.
const DunningScheduleDefault = "3d,5d,7d"

// ParseDunningSchedule parses a dunning schedule: comma-separated offsets
// from a charge's first decline, each a Go duration or a number of days
// ("3d"), strictly increasing. "" is no dunning (declines are final).
func ParseDunningSchedule(s string) ([]time.Duration, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []time.Duration
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		var d time.Duration
		if days, ok := strings.CutSuffix(part, "d"); ok {
			n, err := strconv.ParseFloat(days, 64)
			if err != nil {
				return nil, fmt.Errorf("%q is not a duration: use days (3d) or a Go duration (36h, 90m)", part)
			}
			d = time.Duration(n * float64(24*time.Hour))
		} else {
			var err error
			if d, err = time.ParseDuration(part); err != nil {
				return nil, fmt.Errorf("%q is not a duration: use days (3d) or a Go duration (36h, 90m)", part)
			}
		}
		if d <= 0 {
			return nil, fmt.Errorf("%q: each retry must be after the first decline (a positive duration)", part)
		}
		if len(out) > 0 && d <= out[len(out)-1] {
			return nil, fmt.Errorf("%q: offsets count from the first decline and must increase (%s comes after %s)",
				s, part, out[len(out)-1])
		}
		out = append(out, d)
	}
	return out, nil
}

// FailureNoPaymentMethod is the failure code of a call Stripe refused for
// want of a payment method (stripeapi.Classify): the customer has none
// registered in Tally, no default on Stripe, or one that no longer exists. A
// later try with the payment method the customer adds can succeed.
const FailureNoPaymentMethod = "no_payment_method"

// retryableDeclines are the error codes of declines a later try can fix:
// the card, its funds, the customer's authentication or a missing payment
// method, not the request.
var retryableDeclines = []string{"card_declined", "insufficient_funds", "expired_card", "authentication_required",
	"processing_error", "incorrect_cvc", "card_decline_rate_limit_exceeded", "requires_payment_method", "requires_action",
	FailureNoPaymentMethod}

// DeclineRetryable reports whether failed outcome o is a decline a later try
// can fix (a card error: declined, insufficient funds, expired card,
// authentication required; or no payment method yet), rather than a request
// Stripe refuses whatever the card (invalid request, a canceled
// PaymentIntent).
func DeclineRetryable(o Outcome) bool {
	return o.Class == OutcomeFailed && (o.ErrorType == "card_error" || slices.Contains(retryableDeclines, o.ErrorCode))
}

// dunningStatus is where a retryable decline (DeclineRetryable) takes charge
// c at now: past_due until nextRetry while the schedule has a retry left,
// uncollectible after the last one, failed when c was never past_due and
// there is no schedule.
func (l *Ledger) dunningStatus(c *Charge, now time.Time) (status ChargeStatus, nextRetry *time.Time) {
	schedule := l.config.DunningSchedule
	since := now
	if c.PastDueSince != nil {
		since = *c.PastDueSince
	}
	switch {
	case c.DunningRetries < len(schedule):
		at := since.Add(schedule[c.DunningRetries])
		if at.Before(now) {
			at = now
		}
		return ChargePastDue, &at
	case c.PastDueSince != nil:
		return ChargeUncollectible, nil
	}
	return ChargeFailed, nil
}

// noPaymentMethodHold is the hold of a charge refused for want of a payment
// method (FailureNoPaymentMethod) where no dunning retry is left to wait
// for one: it is no final failure, since the call can succeed once the
// customer has one (the hold's exit: approve).
func noPaymentMethodHold(o Outcome) Outcome {
	return Outcome{Class: OutcomeHeld, HeldReason: HeldNoPaymentMethod, ErrorMessage: fmt.Sprintf(
		"Stripe has no payment method for the charge (%s); give the customer one, then approve the charge", o.ErrorMessage)}
}

// ChargeRetriesDue makes the charge job of up to limit past_due charges
// whose retry is due run now (the dunning scan, every
// jobs.DunningIntervalDefault), and returns their ids.
func (l *Ledger) ChargeRetriesDue(ctx context.Context, limit int) ([]int64, error) {
	rows, err := l.pool.Query(ctx, `
SELECT id FROM billing.charges
WHERE status = 'past_due' AND next_retry_at <= $1 AND (lease_expires_at IS NULL OR lease_expires_at < now())
ORDER BY next_retry_at LIMIT $2`, l.now(), limit)
	if err != nil {
		return nil, fmt.Errorf("error listing charges due for a retry: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("error listing charges due for a retry: %w", err)
	}
	var errs []error
	for _, id := range ids {
		if err := l.ChargeJobRunNow(ctx, id); err != nil {
			errs = append(errs, err) // the others still run
		}
	}
	return ids, errors.Join(errs...)
}

// ChargeRetryReasonDefault is the reason recorded for a retry asked for
// without one.
const ChargeRetryReasonDefault = "retry asked for (payment method updated)"

// ChargeRetryNow asks for the retry of a past_due charge now (a producer
// whose customer updated their payment method): its next retry is due at
// once and its charge job runs now. The retry counts as one of the
// schedule's. It refuses with ConflictChargeNotPastDue a charge in any other
// status.
func (l *Ledger) ChargeRetryNow(ctx context.Context, p ChargeActionParams) (*Charge, error) {
	if strings.TrimSpace(p.Reason) == "" {
		p.Reason = ChargeRetryReasonDefault
	}
	return l.chargeAction(ctx, ActionRetry, p, nil, func(tx *Tx, now time.Time, c *Charge) (*Charge, error) {
		if c.Status != ChargePastDue {
			return nil, &ConflictError{Code: ConflictChargeNotPastDue, Detail: fmt.Sprintf(
				"charge %d is %s; only a past_due charge (declined, with retries left) can be retried", c.ID, c.Status)}
		}
		updated, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET next_retry_at = $2, updated_at = $2 WHERE id = $1 RETURNING `+chargeColumns, c.ID, now))
		if err != nil {
			return nil, fmt.Errorf("error setting the retry: %w", err)
		}
		return updated, l.chargePeriodJobRunNowTx(ctx, tx, c)
	})
}

// ChargeRetryBeginParams are the fields of ChargeRetryBegin.
type ChargeRetryBeginParams struct {
	// Retired are the charge's PaymentIntents on Stripe, every one now
	// canceled (or failed for good): none can succeed any more.
	Retired []string

	// DefaultPaymentMethodID is the Stripe customer's default payment method
	// as the caller just looked it up ("" when none), used when the customer
	// has none registered in Tally.
	DefaultPaymentMethodID string

	Actor string
}

// ChargeRetryBegin starts the retry of a past_due charge the caller claimed
// (Claim.Retry) once it canceled on Stripe every PaymentIntent of the charge
// that could still succeed (p.Retired): in one committed transaction the
// charge records them as retired, moves to pending with its next key
// generation, the customer's current payment method (registered in Tally,
// else p.DefaultPaymentMethodID) and one more dunning retry, and appends the
// attempt row of the call to come. The caller listed the charge's
// PaymentIntents, so no look-up is needed before the call. It returns the
// claim to call Stripe with, ErrLeaseLost, or ErrChargingPaused when an
// operator paused charging since the claim.
func (l *Ledger) ChargeRetryBegin(ctx context.Context, claim *Claim, p ChargeRetryBeginParams) (*Claim, error) {
	var next *Claim
	var attempt *later[int64] // the attempt row's id
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		c, err := chargeLockTx(ctx, tx, claim.Charge.ID)
		if err != nil {
			return err
		}
		if c.Status != ChargePastDue || !claim.holds(c) {
			return ErrLeaseLost
		}
		// The kill switch again: the cancels since the claim took time.
		if err := l.chargingPausedTx(ctx, tx); err != nil {
			return err
		}
		var registered *string
		if err := tx.QueryRow(ctx, `
SELECT stripe_payment_method_id FROM billing.customers WHERE customer_id = $1 AND stripe_customer_id = $2`,
			c.CustomerID, c.StripeCustomerID).Scan(&registered); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("error reading the customer's payment method: %w", err)
		}
		pm := nullString(p.DefaultPaymentMethodID)
		if registered != nil {
			pm = registered
		}
		retired := c.RetiredPaymentIntentIDs
		for _, pi := range p.Retired {
			if !slices.Contains(retired, pi) {
				retired = append(retired, pi)
			}
		}
		gen := c.KeyGeneration + 1
		updated, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET status = 'pending', key_generation = $2, idempotency_key = $3, generation_first_attempted_at = NULL,
    stripe_payment_intent_id = NULL, stripe_charge_id = NULL, failure_code = NULL, failure_message = NULL,
    resolved_by = NULL, stripe_payment_method_id = $4, retired_payment_intent_ids = $5,
    dunning_retries = dunning_retries + 1, next_retry_at = NULL, lookup_required = false,
    cancel_requested_at = NULL, cancel_requested_by = NULL, cancel_reason = NULL,
    attempt_count = attempt_count + 1, last_attempted_at = $6, updated_at = $6
WHERE id = $1 RETURNING `+chargeColumns, c.ID, gen, c.IdempotencyKeyFor(gen), pm, retired, now))
		if err != nil {
			return fmt.Errorf("error starting the retry: %w", err)
		}
		reason := fmt.Sprintf("dunning retry %d of %d: key generation %d", updated.DunningRetries,
			max(len(l.config.DunningSchedule), updated.DunningRetries), gen)
		if len(p.Retired) > 0 {
			reason += ", canceled on Stripe first: " + strings.Join(p.Retired, ", ")
		}
		if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, updated.Status, p.Actor, reason); err != nil {
			return err
		}
		next = &Claim{Charge: updated, Owner: claim.Owner, params: claim.params}
		attempt, err = attemptStartTx(ctx, tx, now, next)
		return err
	})
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrChargingPaused) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("error starting retry of charge %d: %w", claim.Charge.ID, err)
	}
	if next.AttemptID, err = attempt.get(ctx); err != nil {
		return nil, err
	}
	return next, nil
}

// ChargeCancelFinish carries out an operator's cancel of a past_due charge
// (ChargeCancel) that the caller claimed (Claim.Retry) once it canceled on
// Stripe every PaymentIntent of the charge that could still succeed
// (retired; none of the charge's can move money any more). In one
// transaction the charge records them as retired, moves to canceled with
// the operator as its actor, releases its lease and budget reservation, the
// operator action is recorded as done, and done runs (the worker completes
// its job there). It returns ErrLeaseLost when the caller no longer holds
// the charge, or it is no longer past_due.
func (l *Ledger) ChargeCancelFinish(ctx context.Context, claim *Claim, retired []string, done func(ctx context.Context, tx *Tx) error) (*Charge, error) {
	var canceled *Charge
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		c, err := chargeLockTx(ctx, tx, claim.Charge.ID)
		if err != nil {
			return err
		}
		if c.Status != ChargePastDue || c.CancelRequestedAt == nil || !claim.holds(c) {
			return ErrLeaseLost
		}
		actor, reason := *c.CancelRequestedBy, *c.CancelReason
		if c, err = chargeRetireTx(ctx, tx, now, c, retired, actor); err != nil {
			return err
		}
		updated, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET status = 'canceled', next_retry_at = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = $2
WHERE id = $1 RETURNING `+chargeColumns, c.ID, now))
		if err != nil {
			return fmt.Errorf("error canceling: %w", err)
		}
		if err := transitionTx(ctx, tx, now, c.ID, c.CustomerID, &c.Status, updated.Status, actor, "canceled: "+reason); err != nil {
			return err
		}
		if canceled, err = chargeSpendTx(ctx, tx, updated); err != nil {
			return err
		}
		if _, err := operatorActionTx(ctx, tx, now, OperatorAction{Action: ActionCancel, ChargeID: &c.ID, Actor: actor,
			Reason: reason, StatusBefore: &c.Status, StatusAfter: &canceled.Status,
			Detail: map[string]any{"state": "done", "retired_payment_intents": retired}}); err != nil {
			return err
		}
		if done != nil {
			return done(ctx, tx)
		}
		return nil
	})
	if errors.Is(err, ErrLeaseLost) {
		return nil, ErrLeaseLost
	}
	if err != nil {
		return nil, fmt.Errorf("error canceling past_due charge %d: %w", claim.Charge.ID, err)
	}
	l.logger.WarnContext(ctx, "operator action", "action", ActionCancel, "charge_id", canceled.ID, "actor", *canceled.CancelRequestedBy,
		"reason", *canceled.CancelReason, "status_before", string(ChargePastDue), "status_after", string(canceled.Status))
	return canceled, nil
}
