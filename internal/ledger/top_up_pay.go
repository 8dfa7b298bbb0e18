package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TopUpClaimParams are the fields of TopUpClaim.
type TopUpClaimParams struct {
	CustomerID string
	TopUpID    string

	// Owner names the claiming run uniquely; LeaseTTL is how long the
	// lease lasts, on Postgres's clock (as ChargeClaimParams').
	Owner    string
	LeaseTTL time.Duration

	// PaymentMethodID, when set, is the Stripe customer's default payment
	// method, looked up by the caller for a top-up created without one. The
	// claim snapshots it when the top-up still has none and was never
	// attempted, so every call sends the same parameters.
	PaymentMethodID string

	// Actor is the job run, for the transitions log.
	Actor string
}

// TopUpClaim is a top-up leased by a run: the run looks for its
// PaymentIntent on Stripe, then calls Stripe with TopUp.Key if it found
// none, and records what it learned with TopUpRecordOutcome.
type TopUpClaim struct {
	TopUp *TopUp
	Owner string
}

// TopUpClaim leases a top-up that is pending, unknown or processing, in
// one transaction committed before the caller calls Stripe. Once Stripe
// may have forgotten the current key generation (StripeKeyWindow after its
// first claim for a call), it moves to the next: a call only follows a
// look-up that found no PaymentIntent of any generation, and a key Stripe
// still holds would replay its first answer (a stored 500) forever. A top-up that
// was never attempted passes its guards first: the customer's
// max_charge_cents (held over_customer_cap otherwise; Stripe's limits were
// checked when it was created). It returns (nil, nil) when there is nothing
// to do (terminal, held), a *LeaseHeldError when another live run holds the
// lease, and ErrChargingPaused while charging is paused (the kill switch
// stops top-ups too).
func (l *Ledger) TopUpClaim(ctx context.Context, p TopUpClaimParams) (*TopUpClaim, error) {
	var claim *TopUpClaim
	var held *TopUp
	err := l.withTx(ctx, func(tx *Tx) error {
		claim, held = nil, nil
		now := l.now()
		t, err := topUpGetTx(ctx, tx, p.CustomerID, p.TopUpID, true)
		if err != nil {
			return err
		}
		switch {
		case t.Status.Terminal() || t.Status == TopUpHeld:
			return nil
		case t.LeaseLive():
			return &LeaseHeldError{Owner: *t.LeaseOwner, Until: *t.LeaseExpiresAt, Left: t.LeaseLeft}
		}
		if err := l.chargingPausedTx(ctx, tx); err != nil {
			return err
		}
		if t.FirstAttemptedAt == nil {
			var cap *int64
			if err := tx.QueryRow(ctx, `SELECT max_charge_cents FROM billing.customers WHERE customer_id = $1`,
				t.CustomerID).Scan(&cap); err != nil {
				return fmt.Errorf("error reading customer cap: %w", err)
			}
			if cap != nil && t.AmountCents > *cap {
				held, _, err = l.topUpApplyTx(ctx, tx, now, t, Outcome{Class: OutcomeHeld, HeldReason: HeldOverCustomerCap,
					ErrorMessage: fmt.Sprintf("amount %d exceeds the customer's max_charge_cents %d", t.AmountCents, *cap)},
					p.Actor, outcomeLearned)
				return err
			}
		}
		attempt := 1
		if t.Status == TopUpProcessing {
			attempt = 0 // a poll of its PaymentIntent, not a call
		}
		t, err = scanTopUp(tx.QueryRow(ctx, `
UPDATE billing.top_ups
SET lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3),
    stripe_payment_method_id = CASE WHEN stripe_payment_method_id IS NULL AND first_attempted_at IS NULL
                                    THEN $5 ELSE stripe_payment_method_id END,
    attempt_count = attempt_count + $6, first_attempted_at = coalesce(first_attempted_at, $4),
    key_generation = CASE WHEN $6 = 1 AND generation_first_attempted_at <= $7 THEN key_generation + 1
                          ELSE key_generation END,
    generation_first_attempted_at = CASE WHEN $6 = 1 AND (generation_first_attempted_at IS NULL
                                                          OR generation_first_attempted_at <= $7)
                                         THEN $4 ELSE generation_first_attempted_at END,
    last_attempted_at = $4, updated_at = $4
WHERE id = $1
RETURNING `+topUpColumns, t.ID, p.Owner, p.LeaseTTL.Seconds(), now, nullString(p.PaymentMethodID), attempt,
			now.Add(-l.config.StripeKeyWindow)))
		if err != nil {
			return fmt.Errorf("error taking lease: %w", err)
		}
		claim = &TopUpClaim{TopUp: t, Owner: p.Owner}
		return nil
	})
	var leased *LeaseHeldError
	switch {
	case errors.As(err, &leased):
		return nil, leased
	case errors.Is(err, ErrChargingPaused):
		return nil, ErrChargingPaused
	case err != nil:
		return nil, fmt.Errorf("error claiming top-up %q of customer %q: %w", p.TopUpID, p.CustomerID, err)
	}
	if held != nil {
		l.alertTopUpHeld(ctx, held, p.Actor)
	}
	return claim, nil
}

// TopUpRelease gives up a claim's lease without an outcome (the run failed
// before calling Stripe). Releasing a lease already lost is a no-op.
func (l *Ledger) TopUpRelease(ctx context.Context, claim *TopUpClaim) error {
	_, err := l.pool.Exec(ctx, `
UPDATE billing.top_ups SET lease_owner = NULL, lease_expires_at = NULL, updated_at = $3
WHERE id = $1 AND lease_owner = $2`, claim.TopUp.ID, claim.Owner, l.now())
	if err != nil {
		return fmt.Errorf("error releasing lease of top-up %d: %w", claim.TopUp.ID, err)
	}
	return nil
}

// TopUpRecordOutcome records what the claimant learned of its top-up's
// PaymentIntent (its look-up, or its call's answer) and releases the lease,
// in one transaction; then, in the same transaction, it calls complete (the
// River job's completion) when the top-up needs no more runs: it is
// terminal or held. A success writes the grant the top-up bought.
func (l *Ledger) TopUpRecordOutcome(ctx context.Context, claim *TopUpClaim, o Outcome, actor string,
	complete func(ctx context.Context, tx *Tx) error) (*TopUp, error) {
	var t *TopUp
	var changed bool
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		locked, err := topUpGetTx(ctx, tx, claim.TopUp.CustomerID, claim.TopUp.TopUpID, true)
		if err != nil {
			return err
		}
		t, changed, err = l.topUpApplyTx(ctx, tx, now, locked, o, actor, outcomeFromClaimant)
		if err != nil {
			return err
		}
		if (t.Status.Terminal() || t.Status == TopUpHeld) && complete != nil {
			return complete(ctx, tx)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error recording outcome of top-up %d: %w", claim.TopUp.ID, err)
	}
	if changed && t.Status == TopUpHeld {
		l.alertTopUpHeld(ctx, t, actor)
	}
	return t, nil
}

// topUpMayTake reports whether top-up t may take outcome o; like a
// charge's, transitions are monotonic. Pending and unknown take any
// outcome, processing a final one; a failed top-up, or one held for a
// reason that is not a conflict, takes the success of its own PaymentIntent
// (and held, its failure: an operator settled it on Stripe). Succeeded and
// canceled never change.
func topUpMayTake(t *TopUp, o Outcome) bool {
	own := o.StripePaymentIntentID != "" && (t.StripePaymentIntentID == nil || *t.StripePaymentIntentID == o.StripePaymentIntentID)
	switch t.Status {
	case TopUpPending, TopUpUnknown:
		return true
	case TopUpProcessing:
		return o.Class == OutcomeSucceeded || o.Class == OutcomeFailed || o.Class == OutcomeHeld
	case TopUpFailed:
		return o.Class == OutcomeSucceeded && own
	case TopUpHeld:
		return (o.Class == OutcomeSucceeded || o.Class == OutcomeFailed) && own &&
			(t.HeldReason == nil || !t.HeldReason.Conflicting())
	}
	return false
}

// topUpApplyTx applies outcome o to top-up t, locked by the caller, and
// returns it as stored and whether its status changed. The claimant's own
// outcome releases its lease. A success writes the grant (topUpGrantTx).
func (l *Ledger) topUpApplyTx(ctx context.Context, tx *Tx, now time.Time, t *TopUp, o Outcome, actor string,
	source outcomeSource) (*TopUp, bool, error) {
	release := source.lease() == leaseRelease
	if !topUpMayTake(t, o) {
		if o.Class == OutcomeSucceeded && (t.Status != TopUpSucceeded || t.StripePaymentIntentID == nil ||
			*t.StripePaymentIntentID != o.StripePaymentIntentID) {
			// Money moved that the ledger cannot record: a canceled
			// top-up's PaymentIntent, a second one, a mismatch held.
			l.logger.ErrorContext(ctx, "ALERT a PaymentIntent of a top-up succeeded that the top-up cannot record: no grant for it "+
				"(docs/operations.md#alert-top_up_paid_unrecorded)", AlertTopUpPaidUnrecorded.Attr(),
				"customer_id", t.CustomerID, "top_up_id", t.TopUpID, "status", string(t.Status),
				"payment_intent", o.StripePaymentIntentID, "actor", actor)
		}
		if release {
			tx.execLater(nil, `UPDATE billing.top_ups SET lease_owner = NULL, lease_expires_at = NULL, updated_at = $2
WHERE id = $1`, t.ID, now)
		}
		return t, false, nil
	}
	to := t.Status
	switch o.Class {
	case OutcomeSucceeded:
		to = TopUpSucceeded
	case OutcomeFailed:
		to = TopUpFailed
	case OutcomeProcessing:
		to = TopUpProcessing
	case OutcomeHeld:
		to = TopUpHeld
	case OutcomeUnknown, OutcomeError:
		to = TopUpUnknown
	case OutcomeRetryLater:
		// Nothing was created: as it was.
	default:
		return nil, false, fmt.Errorf("top-up %d: no status for outcome %q", t.ID, o.Class)
	}
	var heldReason *HeldReason
	if to == TopUpHeld {
		r := o.HeldReason
		if r == "" {
			r = HeldUnexpectedStatus
		}
		heldReason = &r
	}
	resolvedBy := o.ResolvedBy
	if resolvedBy == "" {
		resolvedBy = "stripe_response"
	}
	updated, err := scanTopUp(tx.QueryRow(ctx, `
UPDATE billing.top_ups
SET status = $2,
    stripe_payment_intent_id = coalesce(stripe_payment_intent_id, $3),
    stripe_charge_id = coalesce($4, stripe_charge_id),
    failure_code = CASE WHEN $2 IN ('failed', 'held', 'unknown') THEN $5 ELSE NULL END,
    failure_message = CASE WHEN $2 IN ('failed', 'held', 'unknown') THEN $6 ELSE NULL END,
    held_reason = $7,
    resolved_by = CASE WHEN $2 IN ('succeeded', 'failed', 'held', 'processing') THEN $8 ELSE resolved_by END,
    lease_owner = CASE WHEN $9 THEN NULL ELSE lease_owner END,
    lease_expires_at = CASE WHEN $9 THEN NULL ELSE lease_expires_at END,
    updated_at = $10
WHERE id = $1
RETURNING `+topUpColumns, t.ID, to, nullString(o.StripePaymentIntentID), nullString(o.StripeChargeID),
		nullString(o.ErrorCode), nullString(o.ErrorMessage), heldReason, resolvedBy, release, now))
	if err != nil {
		return nil, false, fmt.Errorf("error recording top-up %d's outcome: %w", t.ID, err)
	}
	changed := to != t.Status
	if changed {
		reason := o.ErrorMessage
		if o.StripePaymentIntentID != "" {
			reason = fmt.Sprintf("PaymentIntent %s %s", o.StripePaymentIntentID, o.Class)
			if o.ErrorMessage != "" {
				reason += ": " + o.ErrorMessage
			}
		}
		topUpTransitionTx(tx, now, t.ID, t.CustomerID, t.Status, to, actor, reason)
	}
	if to == TopUpSucceeded && changed {
		if err := l.topUpGrantTx(ctx, tx, now, updated, actor); err != nil {
			return nil, false, err
		}
	}
	return updated, changed, nil
}

// topUpGrantTx writes the grant top-up t bought, in the transaction that
// records its success: grant_id "top_up:<top_up_id>", the top-up's amount
// and terms, and its granted entry. Its unique top_up_id holds "one top-up,
// one grant" in Postgres too. An expiry that passed before the payment
// settled (a PaymentIntent processing for days) is dropped: the customer
// paid for the credits. It re-arms the customer's automatic recharge when
// the grant brings the balance back to its threshold.
func (l *Ledger) topUpGrantTx(ctx context.Context, tx *Tx, now time.Time, t *TopUp, actor string) error {
	expires := t.GrantExpiresAt
	if expires != nil && !expires.After(now) {
		l.logger.WarnContext(ctx, "top-up succeeded after its grant's expiry: granted without one",
			"customer_id", t.CustomerID, "top_up_id", t.TopUpID, "grant_expires_at", expires)
		expires = nil
	}
	if _, err := tx.Exec(ctx, `
INSERT INTO billing.credit_grants (customer_id, grant_id, amount_cents, currency, category, priority, expires_at,
                                   created_at, created_by, top_up_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		t.CustomerID, t.GrantID(), t.AmountCents, t.Currency, t.Category, t.Priority, expires, now, actor, t.ID); err != nil {
		return fmt.Errorf("error writing the grant of top-up %d: %w", t.ID, err)
	}
	tx.execLater(nil, `
INSERT INTO billing.credit_grant_entries (customer_id, grant_id, seq, kind, amount_cents, remaining_cents, actor, created_at)
VALUES ($1, $2, 1, 'granted', $3, $3, $4, $5)`, t.CustomerID, t.GrantID(), t.AmountCents, actor, now)
	rechargeRearmTx(tx, t.CustomerID, now)
	return nil
}

// TopUpReconcileParams are the fields of TopUpReconcileTx.
type TopUpReconcileParams struct {
	// Key is the PaymentIntent's metadata.tally_top_up_key.
	Key           string
	Outcome       Outcome
	PaymentIntent *PaymentIntentFacts
	Livemode      bool
	Actor         string
}

// TopUpReconcileTx applies, in tx, what Stripe says of a top-up's
// PaymentIntent (a webhook): the top-up whose key it carries takes its
// outcome, monotonically; a PaymentIntent that carries the key but differs
// (another customer, amount, currency or mode) holds the top-up
// payment_intent_mismatch instead. The lease stays with whoever holds it.
// It returns ErrNotFound when no top-up has the key.
func (l *Ledger) TopUpReconcileTx(ctx context.Context, tx *Tx, p TopUpReconcileParams) (*TopUp, bool, error) {
	now := l.now()
	t, err := scanTopUp(tx.QueryRow(ctx, `SELECT `+topUpColumns+` FROM billing.top_ups WHERE top_up_key = $1 FOR UPDATE`, p.Key))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, notFound("top-up with key %s", p.Key)
	}
	if err != nil {
		return nil, false, fmt.Errorf("error reading top-up: %w", err)
	}
	o := p.Outcome
	if f := p.PaymentIntent; f != nil {
		if why := t.PaymentIntentMismatch(*f, p.Livemode); why != "" {
			o = Outcome{Class: OutcomeHeld, HeldReason: HeldPaymentIntentMismatch, ErrorMessage: why,
				StripePaymentIntentID: f.ID, ResolvedBy: o.ResolvedBy}
		}
	}
	updated, changed, err := l.topUpApplyTx(ctx, tx, now, t, o, p.Actor, outcomeLearned)
	if err != nil {
		return nil, false, err
	}
	if changed && updated.Status == TopUpHeld {
		l.alertTopUpHeld(ctx, updated, p.Actor)
	}
	return updated, changed, nil
}

// PaymentIntentMismatch says why PaymentIntent f cannot be top-up t's, or
// "": it must carry t's key and namespace and be for t's Stripe customer,
// amount and currency, in the mode of Tally's key (livemode).
func (t *TopUp) PaymentIntentMismatch(f PaymentIntentFacts, livemode bool) string {
	c := Charge{ChargeKey: t.Key, KeyNamespace: t.KeyNamespace, StripeCustomerID: t.StripeCustomerID,
		AmountCents: t.AmountCents, Currency: t.Currency}
	return c.PaymentIntentMismatch(f, livemode)
}

// alertTopUpHeld raises alert top_up_held for t.
func (l *Ledger) alertTopUpHeld(ctx context.Context, t *TopUp, actor string) {
	var reason, detail string
	if t.HeldReason != nil {
		reason = string(*t.HeldReason)
	}
	if t.FailureMessage != nil {
		detail = *t.FailureMessage
	}
	l.logger.ErrorContext(ctx, "ALERT top-up held: no more calls until an operator acts (docs/operations.md#alert-top_up_held)",
		AlertTopUpHeld.Attr(), "customer_id", t.CustomerID, "top_up_id", t.TopUpID, "held_reason", reason,
		"detail", detail, "actor", actor)
}

// TopUpCancelParams are the fields of TopUpCancel.
type TopUpCancelParams struct {
	CustomerID string
	TopUpID    string
	Reason     string
	Actor      string
}

// TopUpCancel cancels a top-up that is held, or pending and never
// attempted (no PaymentIntent of it can exist). A held top-up's
// PaymentIntent, if it has one, must have been settled on Stripe by the
// operator first (docs/operations.md#alert-top_up_held): canceling only
// ends the top-up in the ledger. It reports false when it was canceled
// already, and returns a *ConflictError top_up_not_cancelable otherwise.
func (l *Ledger) TopUpCancel(ctx context.Context, p TopUpCancelParams) (*TopUp, bool, error) {
	if err := checkReason(p.Reason); err != nil {
		return nil, false, err
	}
	var t *TopUp
	var changed bool
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		var err error
		t, err = topUpGetTx(ctx, tx, p.CustomerID, p.TopUpID, true)
		if err != nil {
			return err
		}
		if t.Status == TopUpCanceled {
			changed = false
			return nil
		}
		from := t.Status
		neverCalled := t.Status == TopUpPending && t.FirstAttemptedAt == nil && !t.LeaseLive()
		if t.Status != TopUpHeld && !neverCalled {
			return &ConflictError{Code: ConflictTopUpNotCancelable, Detail: fmt.Sprintf(
				"top-up %q of customer %q is %s after %d attempts: only a held top-up, or a pending one never sent to Stripe, "+
					"can be canceled", t.TopUpID, t.CustomerID, t.Status, t.AttemptCount)}
		}
		t, err = scanTopUp(tx.QueryRow(ctx, `
UPDATE billing.top_ups SET status = 'canceled', canceled_by = $2, cancel_reason = $3, lease_owner = NULL,
    lease_expires_at = NULL, updated_at = $4
WHERE id = $1 RETURNING `+topUpColumns, t.ID, p.Actor, p.Reason, now))
		if err != nil {
			return fmt.Errorf("error canceling top-up: %w", err)
		}
		topUpTransitionTx(tx, now, t.ID, t.CustomerID, from, TopUpCanceled, p.Actor, p.Reason)
		changed = true
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("error canceling top-up %q of customer %q: %w", p.TopUpID, p.CustomerID, err)
	}
	return t, changed, nil
}

// TopUpsStuck returns the top-ups not settled (pending, unknown,
// processing) and not moved for longer than after, oldest first, at most
// limit: the sweep alerts them and makes their jobs run again.
func (l *Ledger) TopUpsStuck(ctx context.Context, after time.Duration, limit int) ([]*TopUp, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+topUpColumns+` FROM billing.top_ups
WHERE status IN ('pending', 'unknown', 'processing') AND updated_at < $1 AND (lease_expires_at IS NULL OR lease_expires_at < now())
ORDER BY updated_at LIMIT $2`, l.now().Add(-after), limit)
	if err != nil {
		return nil, fmt.Errorf("error reading stuck top-ups: %w", err)
	}
	ts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*TopUp, error) { return scanTopUp(r) })
	if err != nil {
		return nil, fmt.Errorf("error reading stuck top-ups: %w", err)
	}
	return ts, nil
}

// TopUpJobRunNow makes top-up t's job run now (River JobRetry: a
// discarded or deleted job runs again, a running one is left alone) and
// records its id when it changed.
func (l *Ledger) TopUpJobRunNow(ctx context.Context, customerID, topUpID string) error {
	return l.withTx(ctx, func(tx *Tx) error {
		t, err := topUpGetTx(ctx, tx, customerID, topUpID, true)
		if err != nil {
			return err
		}
		var old int64
		if t.JobID != nil {
			old = *t.JobID
		}
		id, err := l.config.Scheduler.TopUpJobRunNowTx(ctx, tx, old, customerID, topUpID)
		if err != nil {
			return err
		}
		if id != old {
			tx.execLater(nil, `UPDATE billing.top_ups SET job_id = $2 WHERE id = $1`, t.ID, id)
		}
		return nil
	})
}
