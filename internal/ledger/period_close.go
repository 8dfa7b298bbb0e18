package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// PeriodCloseParams are the fields of PeriodClose.
type PeriodCloseParams struct {
	CustomerID string
	Period     string

	// Actor is who closes: job:<id>/<attempt> or operator:<key prefix>.
	Actor string

	// RunChargeJobNow makes the period's charge job available at once (in the
	// same transaction), for an explicit close before the scheduled time.
	RunChargeJobNow bool

	// paidOnStripe creates the charge pending even when its total is zero:
	// Stripe has a PaymentIntent for it (ChargeRecoverLost).
	paidOnStripe bool
}

// PeriodClose closes a period and returns its charge: the close of step 2
// of the money path ("close and claim"), in one transaction. It locks the
// period FOR UPDATE, so it waits for in-flight ingests holding FOR KEY SHARE
// and every later ingest sees the period closed; marks it closed; and,
// unless the charge exists already (then it is returned unchanged), sums the
// period's events and creates the charge: skipped for a zero total, pending
// otherwise (the guards hold it, if need be, before its first call:
// ChargeClaim). The charge snapshots the Stripe customer, payment method,
// amount and currency.
//
// It returns ErrNotFound when the period does not exist.
func (l *Ledger) PeriodClose(ctx context.Context, p PeriodCloseParams) (*Charge, error) {
	if !ValidID(p.CustomerID) || !ValidID(p.Period) {
		return nil, notFound("period %s of customer %q", p.Period, p.CustomerID)
	}
	var charge *Charge
	err := l.withTx(ctx, func(tx *Tx) error {
		var err error
		charge, err = l.periodCloseTx(ctx, tx, l.now(), p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("error closing period %s/%s: %w", p.CustomerID, p.Period, err)
	}
	return charge, nil
}

// PeriodCloseClaimParams are the fields of PeriodCloseClaim.
type PeriodCloseClaimParams struct {
	Close PeriodCloseParams

	// Claim is the claim's; its ChargeID is ignored (the period's charge is
	// claimed).
	Claim ChargeClaimParams

	// PaymentMethodOf is the Stripe customer whose default payment method
	// the caller looked up (Claim.PaymentMethodID, empty when it has none),
	// as ChargePreflight asked; "" when it looked up none. The
	// claim snapshots it only for a charge of that Stripe customer.
	PaymentMethodOf string
}

// ClosedClaim is what PeriodCloseClaim did.
type ClosedClaim struct {
	// Charge is the period's charge, after the claim when one was taken.
	Charge *Charge

	// Claim is the lease taken, or nil: the charge needs no Stripe call now
	// (its status says why: terminal, held, processing, carried forward),
	// or NeedsPaymentMethod.
	Claim *Claim

	// NeedsPaymentMethod is set when the charge has no payment method, was
	// never attempted and the caller looked none up for its Stripe customer
	// (the look-up failed, or the customer changed since
	// ChargePreflight answered): the close is committed but
	// nothing was claimed; look the payment method up and call again.
	NeedsPaymentMethod bool
}

// PeriodCloseClaim is step 2 of the money path in one transaction:
// PeriodClose, then ChargeClaim of the period's charge. The close commits
// even when the claim is refused: a *LeaseHeldError or ErrChargingPaused is
// returned after the commit, as ChargeClaim returns them. One commit, not
// two, on the path of every charge; the claim is still committed before any
// money moves.
func (l *Ledger) PeriodCloseClaim(ctx context.Context, p PeriodCloseClaimParams) (*ClosedClaim, error) {
	if !ValidID(p.Close.CustomerID) || !ValidID(p.Close.Period) {
		return nil, notFound("period %s of customer %q", p.Close.Period, p.Close.CustomerID)
	}
	var out ClosedClaim
	var cl claimed
	var refused error // the claim's refusal, returned once the close is committed
	err := l.withTx(ctx, func(tx *Tx) error {
		out, cl, refused = ClosedClaim{}, claimed{}, nil
		now := l.now()
		c, err := l.periodCloseTx(ctx, tx, now, p.Close)
		if err != nil {
			return err
		}
		out.Charge, p.Claim.ChargeID = c, c.ID
		if c.Status.Chargeable() && c.StripePaymentMethodID == nil && c.GenerationFirstAttemptedAt == nil && p.PaymentMethodOf != c.StripeCustomerID {
			out.NeedsPaymentMethod = true
			return nil
		}
		cl, err = l.chargeClaimTx(ctx, tx, now, c, p.Claim)
		var leased *LeaseHeldError
		if errors.As(err, &leased) || errors.Is(err, ErrChargingPaused) {
			refused = err
			return nil
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("error closing period %s/%s: %w", p.Close.CustomerID, p.Close.Period, err)
	}
	claim, err := l.claimDone(ctx, cl, p.Claim, refused)
	if err != nil {
		return nil, err
	}
	out.Claim = claim
	switch {
	case claim != nil:
		out.Charge = claim.Charge
	case cl.held != nil:
		out.Charge = cl.held
	case cl.carried != nil:
		out.Charge = cl.carried
	}
	return &out, nil
}

// Preflight is what a charge run reads before the close (money path step
// 1) so that it can ask Stripe first, and the close, the claim and the
// key's first use are one transaction.
type Preflight struct {
	// PaymentMethodOf is the Stripe customer whose default payment method
	// the charge needs looked up: the charge, or while it does not exist the
	// customer, has no payment method registered, and the charge was never
	// attempted. "" when there is nothing to look up.
	PaymentMethodOf string

	// Lookup, when set, is the charge's look-up at Stripe (money path step
	// 5), due before its first call because this database holds no attempt
	// of its key generation: a charge not yet created (of a period with
	// events) or one never attempted. A caller that lists it and finds no
	// PaymentIntent carrying the key passes it on as
	// ChargeClaimParams.LookedUp.
	Lookup *LookupTarget
}

// LookupTarget is what a look-up at Stripe lists: the Stripe customer's
// PaymentIntents created since the period began (less a margin) that carry
// the charge key of the namespace.
type LookupTarget struct {
	StripeCustomerID string
	ChargeKey        string
	Namespace        string
	PeriodStartsAt   time.Time
}

// LookupTarget is the look-up of charge c.
func (c *Charge) LookupTarget() LookupTarget {
	return LookupTarget{StripeCustomerID: c.StripeCustomerID, ChargeKey: c.ChargeKey, Namespace: c.KeyNamespace, PeriodStartsAt: c.PeriodStartsAt}
}

// Is reports whether t and o list the same PaymentIntents.
func (t LookupTarget) Is(o LookupTarget) bool {
	return t.StripeCustomerID == o.StripeCustomerID && t.ChargeKey == o.ChargeKey && t.Namespace == o.Namespace &&
		t.PeriodStartsAt.Equal(o.PeriodStartsAt)
}

// ChargePreflight returns what the charge of (customer, period) needs from
// Stripe before its close and claim (Preflight). Everything it says is
// checked again by the claim, under the charge's lock.
func (l *Ledger) ChargePreflight(ctx context.Context, customerID, period string) (Preflight, error) {
	var stripeCustomer string
	var needsPaymentMethod, needsLookup bool
	var chargeKey *string
	var namespace string // a v1 charge's (keyed before namespaces) is ""
	var startsAt *time.Time
	err := l.pool.QueryRow(ctx, `
SELECT coalesce(ch.stripe_customer_id, cu.stripe_customer_id),
       CASE WHEN ch.id IS NULL THEN cu.stripe_payment_method_id IS NULL
            ELSE ch.stripe_payment_method_id IS NULL AND ch.generation_first_attempted_at IS NULL
                 AND ch.status IN ('pending', 'unknown') END,
       CASE WHEN ch.id IS NULL THEN p.period IS NOT NULL
                 AND EXISTS (SELECT 1 FROM billing.usage_events_counted e WHERE e.customer_id = $1 AND e.period = $2)
            ELSE ch.generation_first_attempted_at IS NULL AND NOT ch.lookup_required
                 AND ch.status IN ('pending', 'unknown') END,
       ch.charge_key, coalesce(ch.key_namespace, ''), coalesce(ch.period_starts_at, p.starts_at)
FROM billing.customers cu
LEFT JOIN billing.periods p ON p.customer_id = cu.customer_id AND p.period = $2
LEFT JOIN billing.charges ch ON ch.customer_id = cu.customer_id AND ch.period = $2
WHERE cu.customer_id = $1`, customerID, period).Scan(&stripeCustomer, &needsPaymentMethod, &needsLookup, &chargeKey, &namespace, &startsAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Preflight{}, nil
	}
	if err != nil {
		return Preflight{}, fmt.Errorf("error reading the preflight of %s/%s: %w", customerID, period, err)
	}
	var pf Preflight
	if needsPaymentMethod {
		pf.PaymentMethodOf = stripeCustomer
	}
	if needsLookup && startsAt != nil {
		t := LookupTarget{StripeCustomerID: stripeCustomer, PeriodStartsAt: *startsAt,
			ChargeKey: ChargeKey(l.config.Namespace, customerID, period), Namespace: l.config.Namespace}
		if chargeKey != nil {
			t.ChargeKey, t.Namespace = *chargeKey, namespace
		}
		pf.Lookup = &t
	}
	return pf, nil
}

// periodCloseTx is PeriodClose's work in tx. The charge it returns, found or
// created, is locked FOR UPDATE until tx ends.
func (l *Ledger) periodCloseTx(ctx context.Context, tx *Tx, now time.Time, p PeriodCloseParams) (*Charge, error) {
	var status, currency string
	var jobID *int64
	err := tx.QueryRow(ctx, `
SELECT status, charge_job_id, currency FROM billing.periods
WHERE customer_id = $1 AND period = $2
FOR UPDATE`, p.CustomerID, p.Period).Scan(&status, &jobID, &currency)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("period %s of customer %q", p.Period, p.CustomerID)
	}
	if err != nil {
		return nil, fmt.Errorf("error locking period: %w", err)
	}
	if status == PeriodOpen {
		// Sent with the next statement: the lock above is what orders the
		// close against ingest.
		tx.execLater(nil, `
UPDATE billing.periods SET status = 'closed', closed_at = $3
WHERE customer_id = $1 AND period = $2`, p.CustomerID, p.Period, now)
		recordNotice(tx, notice{typ: NotifyPeriodClosed, customerID: p.CustomerID, period: p.Period})
	}
	if p.RunChargeJobNow {
		if err := l.chargeJobRunNowTx(ctx, tx, p.CustomerID, p.Period, jobID); err != nil {
			return nil, err
		}
	}

	charge, err := scanCharge(tx.QueryRow(ctx, `SELECT `+chargeColumns+`
FROM billing.charges WHERE customer_id = $1 AND period = $2 FOR UPDATE`, p.CustomerID, p.Period))
	if err == nil {
		return charge, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("error reading charge: %w", err)
	}
	charge, recharge, err := chargeCreateTx(ctx, tx, p, l.config.Namespace, currency, now)
	if err != nil || !recharge {
		return charge, err
	}
	if _, err := l.rechargeCheckTx(ctx, tx, now, p.CustomerID, p.Actor, 0); err != nil {
		return nil, err
	}
	return charge, nil
}
