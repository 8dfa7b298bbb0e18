package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// LeaseHeldError is returned by ChargeClaim when another worker holds the
// charge's lease; the caller should wait Left (until Until on Postgres's
// clock) and try again.
type LeaseHeldError struct {
	Owner string
	Until time.Time
	Left  time.Duration
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("charge lease held by %s until %s", e.Owner, e.Until.Format(time.RFC3339Nano))
}

// ChargeClaimParams are the fields of ChargeClaim.
type ChargeClaimParams struct {
	ChargeID int64

	// Owner names the claiming run uniquely (host, process, job, attempt).
	Owner string

	// LeaseTTL is how long the claim lasts, on Postgres's clock (shared by
	// every replica, whatever their own clocks say). It must outlive the
	// worker's timeout, so a run that is still alive always holds its lease.
	LeaseTTL time.Duration

	// JobID and JobAttempt identify the River job run, for the attempt log.
	JobID      int64
	JobAttempt int

	// PaymentMethodID, when set, is the Stripe customer's default payment
	// method, looked up by the caller for a charge created without one (its
	// customer had none registered). The claim snapshots it on the charge
	// when the charge still has none and Stripe was never called for it, so
	// every attempt sends the same parameters.
	PaymentMethodID string

	// LookedUp, when set, is a look-up at Stripe the caller made before the
	// claim (Preflight.Lookup) that found no PaymentIntent carrying the
	// charge key. When it is the charge's (Charge.LookupTarget), the charge
	// holds no attempt of its key generation and no operator asked for a
	// look-up (LookupRequired), the claim takes it as the charge's look-up
	// (money path steps 5 and 6): it marks the key's first use and appends
	// the attempt row in its own transaction, as ChargeLookupNone would in
	// the next, and the claim needs no Lookup. That is sound because a run calls
	// Stripe with a key generation only after committing an attempt of it:
	// no PaymentIntent carrying the key can have been created since the
	// look-up, or the claim, under the charge's lock, would see its attempt.
	LookedUp *LookupTarget
}

// Claim is a claimed charge. Unless Lookup is set, AttemptID is the attempt
// row of the Stripe call the claimant is about to make with
// Charge.IdempotencyKey.
type Claim struct {
	Charge    *Charge
	AttemptID int64
	Owner     string

	// Lookup is set when the claimant must look for the charge's
	// PaymentIntents on Stripe before any call (money path step 5), because
	// this database cannot prove that Stripe never saw the charge or still
	// knows its key: it holds no attempt of the current key generation (its
	// record may have been lost to a restore or a lossy failover), an
	// operator marked the charge after such a loss (LookupRequired), or the
	// key window passed (KeyExpired). The claimant adopts what it finds, or
	// calls ChargeLookupNone before calling Stripe.
	Lookup bool

	// KeyExpired is set, with Lookup, when the current key generation's first
	// attempt is older than the Stripe key window: Stripe may have forgotten
	// the key, so a look-up that finds nothing moves to the next generation.
	KeyExpired bool

	// Retry is set when the charge is past_due and its retry is due: the
	// claimant cancels on Stripe every PaymentIntent of the charge that could
	// still succeed, then calls ChargeRetryBegin — or ChargeCancelFinish when
	// an operator asked to cancel the charge (Charge.CancelRequestedAt) — or
	// records what it found: a PaymentIntent that succeeded after all.
	// Nothing else is written.
	Retry bool

	params ChargeClaimParams
}

// ChargeClaim is step 2 of the money path. In one transaction it takes the
// charge's lease if the charge is pending or unknown and the lease is free or
// expired, counts the attempt, sets first_attempted_at once and snapshots the
// payment method the caller looked up (ChargeClaimParams.PaymentMethodID). When the
// charge needs a look-up at Stripe first (see Claim.Lookup) it sets
// Claim.Lookup and writes nothing more; otherwise it appends the attempt row
// of the coming Stripe call. It commits before the caller calls Stripe.
//
// Before its first call a charge passes the guards (chargeGuardsTx: Stripe's
// limits, the customer's cap, the anomaly guard, the period budget, whose
// reservation it takes in the same transaction); a charge that fails one is
// held instead, or carried forward when below Stripe's minimum, and
// ChargeClaim returns (nil, nil).
//
// A past_due charge whose retry is due (NextRetryAt) is leased with
// Claim.Retry set, and nothing more (see Claim.Retry).
//
// It returns (nil, nil) when the charge is in any other status (terminal,
// held, processing, past_due before its retry): there is nothing to do. It returns a *LeaseHeldError
// when another live run holds the lease, and ErrChargingPaused while an
// operator has paused charging (the kill switch).
func (l *Ledger) ChargeClaim(ctx context.Context, p ChargeClaimParams) (*Claim, error) {
	var cl claimed
	err := l.withTx(ctx, func(tx *Tx) error {
		c, err := chargeLockTx(ctx, tx, p.ChargeID)
		if err != nil {
			return err
		}
		cl, err = l.chargeClaimTx(ctx, tx, l.now(), c, p)
		return err
	})
	return l.claimDone(ctx, cl, p, err)
}

// claimed is what chargeClaimTx did: took the lease (claim), or held or
// carried forward the charge.
type claimed struct {
	claim         *Claim
	attempt       *later[int64] // the id of the claim's attempt row, if it has one
	held, carried *Charge
}

// chargeClaimTx is ChargeClaim's work in tx on charge c, locked FOR UPDATE
// by the caller. It returns a *LeaseHeldError or ErrChargingPaused before
// writing anything, so a caller may still commit what it wrote before.
func (l *Ledger) chargeClaimTx(ctx context.Context, tx *Tx, now time.Time, c *Charge, p ChargeClaimParams) (claimed, error) {
	retry := c.Status == ChargePastDue && !c.NextRetryAt.After(now)
	if !c.Status.Chargeable() && !retry {
		return claimed{}, nil
	}
	if c.LeaseLive() {
		return claimed{}, &LeaseHeldError{Owner: *c.LeaseOwner, Until: *c.LeaseExpiresAt, Left: c.LeaseLeft}
	}
	// The guards stop money from moving; a cancel moves none.
	canceling := retry && c.CancelRequestedAt != nil
	var reads *guardReads
	if !c.BudgetReserved && !canceling {
		// Queued: they go with the kill switch's read.
		reads = l.chargeGuardReadsTx(tx, c)
	}
	if err := l.chargingPausedTx(ctx, tx); err != nil {
		return claimed{}, err
	}
	if !c.BudgetReserved && !canceling {
		v, err := l.chargeGuardsTx(ctx, tx, c, reads)
		if err != nil {
			return claimed{}, err
		}
		switch {
		case v.carry:
			carried, err := chargeCarryForwardTx(ctx, tx, now, c, p.actor(), v.detail)
			return claimed{carried: carried}, err
		case v.hold != "":
			applied, err := l.chargeApplyOutcomeTx(ctx, tx, now, c,
				Outcome{Class: OutcomeHeld, HeldReason: v.hold, ErrorMessage: v.detail}, p.actor(), outcomeLearned)
			return claimed{held: applied.Charge}, err
		}
	}
	if retry {
		// A retry keeps the reservation its first call took (or takes it,
		// having just passed its guards: a charge restored without it).
		c, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges SET lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3),
    budget_reserved = budget_reserved OR NOT $5, updated_at = $4
WHERE id = $1 RETURNING `+chargeColumns, c.ID, p.Owner, p.LeaseTTL.Seconds(), now, canceling))
		if err != nil {
			return claimed{}, fmt.Errorf("error taking lease: %w", err)
		}
		return claimed{claim: &Claim{Charge: c, Owner: p.Owner, Retry: true, params: p}}, nil
	}
	// The lease, the reservation of a charge that just passed its guards
	// (one that had passed them before keeps its own), the payment method
	// of a charge that has none and whose key generation was never
	// attempted (its parameters are not fixed yet), and the key's
	// first use when the caller's look-up stands for the charge's.
	lookedUp := p.LookedUp != nil && p.LookedUp.Is(c.LookupTarget()) && c.GenerationFirstAttemptedAt == nil && !c.LookupRequired
	c, err := scanCharge(tx.QueryRow(ctx, `
UPDATE billing.charges
SET lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3), budget_reserved = true,
    stripe_payment_method_id = CASE WHEN stripe_payment_method_id IS NULL AND generation_first_attempted_at IS NULL
                                    THEN $5 ELSE stripe_payment_method_id END,
    attempt_count = attempt_count + 1,
    first_attempted_at = coalesce(first_attempted_at, $4),
    generation_first_attempted_at = CASE WHEN $6 THEN $4 ELSE generation_first_attempted_at END,
    last_attempted_at = $4, updated_at = $4
WHERE id = $1
RETURNING `+chargeColumns, c.ID, p.Owner, p.LeaseTTL.Seconds(), now, nullString(p.PaymentMethodID), lookedUp))
	if err != nil {
		return claimed{}, fmt.Errorf("error taking lease: %w", err)
	}
	claim := &Claim{Charge: c, Owner: p.Owner, params: p}
	gen := c.GenerationFirstAttemptedAt
	claim.KeyExpired = gen != nil && now.Sub(*gen) >= l.config.StripeKeyWindow
	claim.Lookup = gen == nil || c.LookupRequired || claim.KeyExpired
	if claim.Lookup {
		return claimed{claim: claim}, nil
	}
	attempt, err := attemptStartTx(ctx, tx, now, claim)
	return claimed{claim: claim, attempt: attempt}, err
}

// claimDone finishes a claim once its transaction ended with err: it alerts
// a hold, logs a carry-forward and returns the claim, or the error.
func (l *Ledger) claimDone(ctx context.Context, cl claimed, p ChargeClaimParams, err error) (*Claim, error) {
	if err != nil {
		var leased *LeaseHeldError
		if errors.As(err, &leased) {
			return nil, leased
		}
		if errors.Is(err, ErrChargingPaused) {
			return nil, ErrChargingPaused
		}
		return nil, fmt.Errorf("error claiming charge %d: %w", p.ChargeID, err)
	}
	if cl.held != nil {
		l.alertIfHeld(ctx, ChargePending, cl.held, p.actor())
	}
	if c := cl.carried; c != nil {
		l.logger.InfoContext(ctx, "charge carried forward: below Stripe's minimum", "charge_id", c.ID,
			"customer_id", c.CustomerID, "period", c.Period, "amount_cents", c.AmountCents, "currency", c.Currency)
	}
	if cl.attempt != nil {
		if cl.claim.AttemptID, err = cl.attempt.get(ctx); err != nil {
			return nil, fmt.Errorf("error claiming charge %d: %w", p.ChargeID, err)
		}
	}
	return cl.claim, nil
}

// actor is who claims, for the transitions log: the job run.
func (p ChargeClaimParams) actor() string {
	return fmt.Sprintf("job:%d/%d", p.JobID, p.JobAttempt)
}

// ChargeRelease gives up a claim's lease without an outcome, so the next run
// need not wait for it to expire (the caller failed before calling Stripe).
// Releasing a lease already lost is a no-op.
func (l *Ledger) ChargeRelease(ctx context.Context, claim *Claim) error {
	_, err := l.pool.Exec(ctx, `
UPDATE billing.charges SET lease_owner = NULL, lease_expires_at = NULL, updated_at = $3
WHERE id = $1 AND lease_owner = $2`, claim.Charge.ID, claim.Owner, l.now())
	if err != nil {
		return fmt.Errorf("error releasing lease of charge %d: %w", claim.Charge.ID, err)
	}
	return nil
}
