package jobs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripeapi"
)

// lookupLookback is how long before the charge's period began the search for
// its PaymentIntents starts, covering clock skew between Tally and Stripe.
const lookupLookback = time.Hour

// chargePaymentIntents returns the PaymentIntents on Stripe that carry charge
// c's key: its Stripe customer's PaymentIntents created since the charge's
// period began (minus lookupLookback), every page, matched by
// metadata.tally_charge_key — which stays the same across key generations,
// so an earlier generation's PaymentIntent is never missed — and by
// metadata.tally_namespace, so another deployment's are never touched. The
// bound is the period's start, not the charge's first attempt in this
// database: that record may have been lost (a restored backup, a lossy
// failover) and the charge created again later. It lists; it never uses
// Stripe Search, which lags.
func chargePaymentIntents(ctx context.Context, s Stripe, c *ledger.Charge) ([]*stripe.PaymentIntent, error) {
	return paymentIntentsOf(ctx, s, c.LookupTarget())
}

// paymentIntentsOf lists the PaymentIntents of look-up t: chargePaymentIntents
// of a charge that may not exist yet (ledger.Preflight.Lookup).
func paymentIntentsOf(ctx context.Context, s Stripe, t ledger.LookupTarget) ([]*stripe.PaymentIntent, error) {
	all, err := s.PaymentIntentList(ctx, t.StripeCustomerID, t.PeriodStartsAt.Add(-lookupLookback))
	if err != nil {
		return nil, err
	}
	var mine []*stripe.PaymentIntent
	for _, pi := range all {
		if pi.Metadata["tally_charge_key"] == t.ChargeKey && pi.Metadata["tally_namespace"] == t.Namespace {
			mine = append(mine, pi)
		}
	}
	return mine, nil
}

// paymentIntentFacts is what the ledger checks of a PaymentIntent before it
// records it as a charge's (ledger.Charge.PaymentIntentMismatch).
func paymentIntentFacts(pi *stripe.PaymentIntent) ledger.PaymentIntentFacts {
	return ledger.PaymentIntentFacts{ID: pi.ID, Customer: customerOf(pi), Amount: pi.Amount, Currency: string(pi.Currency),
		Livemode: pi.Livemode, ChargeKey: pi.Metadata["tally_charge_key"], Namespace: pi.Metadata["tally_namespace"]}
}

// reconcileOutcome says what the charge's PaymentIntents on Stripe mean
// (those that count, paymentIntentsThatCount): one that is really the charge's (the ledger's check, against livemode, the mode
// of Tally's key) → its outcome (resolved by reconcile); one that differs →
// held payment_intent_mismatch; more than one → held, a double charge a human
// must see. found is false when there is none.
func reconcileOutcome(c *ledger.Charge, pis []*stripe.PaymentIntent, livemode bool) (o ledger.Outcome, found bool) {
	pis = paymentIntentsThatCount(c, pis)
	switch len(pis) {
	case 0:
		return ledger.Outcome{}, false
	case 1:
		pi := pis[0]
		if why := c.PaymentIntentMismatch(paymentIntentFacts(pi), livemode); why != "" {
			// Not ours to adopt (a restored ledger summing to another amount,
			// another environment, a bug): a human decides.
			return ledger.Outcome{Class: ledger.OutcomeHeld, HeldReason: ledger.HeldPaymentIntentMismatch, ErrorMessage: why}, true
		}
		o = stripeapi.OutcomeOf(pi)
		o.ResolvedBy = "reconcile"
		return o, true
	}
	ids := paymentIntentIDs(pis)
	return ledger.Outcome{
		Class:      ledger.OutcomeHeld,
		HeldReason: ledger.HeldDoubleCharge,
		ErrorMessage: fmt.Sprintf("ALERT double charge: %d PaymentIntents carry tally_charge_key %s: %s",
			len(pis), c.ChargeKey, strings.Join(ids, ", ")),
	}, true
}

// paymentIntentsThatCount are the PaymentIntents of pis that say something
// of charge c now. One that a dunning retry canceled (Charge.Retired) says
// nothing unless money moved for it. Of several others, a dunning retry
// leaves canceled ones behind, which can never move money: so one that moved
// money (succeeded, processing) with the rest canceled is the charge's
// outcome, and with none that moved, the one still open (a decline the
// customer may still complete) or else the newest canceled one is. Any other
// mix — two that moved, or one that moved or is open beside another open one
// that could still succeed — is returned whole: a double charge a human
// must see.
func paymentIntentsThatCount(c *ledger.Charge, pis []*stripe.PaymentIntent) []*stripe.PaymentIntent {
	var live, moved, open, canceled []*stripe.PaymentIntent
	for _, pi := range pis {
		if c.Retired(pi.ID) && !paymentIntentMoved(pi) {
			continue
		}
		live = append(live, pi)
		switch {
		case paymentIntentMoved(pi):
			moved = append(moved, pi)
		case pi.Status == stripe.PaymentIntentStatusCanceled:
			canceled = append(canceled, pi)
		default:
			open = append(open, pi)
		}
	}
	switch {
	case len(live) <= 1:
		return live
	case len(moved) == 1 && len(open) == 0:
		return moved
	case len(moved) == 0 && len(open) == 1:
		return open
	case len(moved) == 0 && len(open) == 0:
		newest := canceled[0]
		for _, pi := range canceled[1:] {
			if pi.Created > newest.Created || (pi.Created == newest.Created && pi.ID > newest.ID) {
				newest = pi
			}
		}
		return []*stripe.PaymentIntent{newest}
	}
	return append(moved, open...)
}

// paymentIntentMoved reports whether money moved, or may still move without
// anyone confirming it again, for pi: it succeeded or is processing.
func paymentIntentMoved(pi *stripe.PaymentIntent) bool {
	return pi.Status == stripe.PaymentIntentStatusSucceeded || pi.Status == stripe.PaymentIntentStatusProcessing
}

// ReconcileResult is what ReconcileCharge did.
type ReconcileResult struct {
	Charge *ledger.Charge

	// Action is resolved (the charge took Stripe's outcome), unchanged
	// (Stripe agrees, has nothing final yet, or has nothing for a charge that
	// no longer calls), looked_up (a held charge marked for a look-up has no
	// PaymentIntent on Stripe: the mark is cleared), double_charge (Stripe has another PaymentIntent for
	// a charge that names one: held if it was not final, alerted either way),
	// requeued (no PaymentIntent: the charge job was made to run now) or
	// skipped (a live worker holds it, or it is settled).
	Action string

	// PaymentIntents are the charge's PaymentIntents found on Stripe.
	PaymentIntents []*stripe.PaymentIntent
}

// reconcileStatuses are the statuses ReconcileCharge looks at: every one not
// settled in Stripe-confirmed terms. A failed charge's PaymentIntent may yet
// succeed (the customer authenticates on-session), so may a past_due or
// uncollectible one's; a held one's may exist.
var reconcileStatuses = []ledger.ChargeStatus{ledger.ChargePending, ledger.ChargeUnknown, ledger.ChargeProcessing, ledger.ChargeHeld,
	ledger.ChargeFailed, ledger.ChargePastDue, ledger.ChargeUncollectible}

// ReconcileCharge brings one charge that is not settled in Stripe-confirmed
// terms (see reconcileStatuses) in line with Stripe: by its PaymentIntent when
// the ledger knows it, else by listing the customer's PaymentIntents for the
// charge's key. One found → the charge takes its outcome where the status
// machine allows it (a held double charge stays held; a failed charge takes
// only the success of its own PaymentIntent); several → held; none → a pending
// or unknown charge's job is made to run now, to call with its key after its
// own look-up, and any other charge is left as it is. It is safe to run at any
// time, from any number of processes: every write is monotonic.
func ReconcileCharge(ctx context.Context, l *ledger.Ledger, s Stripe, c *ledger.Charge) (*ReconcileResult, error) {
	res := &ReconcileResult{Charge: c, Action: "skipped"}
	if !slices.Contains(reconcileStatuses, c.Status) {
		return res, nil
	}
	pis, err := chargeStripeFind(ctx, s, c)
	if err != nil {
		return nil, err
	}
	res.PaymentIntents = pis

	o, found := reconcileOutcome(c, pis, s.Livemode())
	if !found {
		if c.Status == ledger.ChargeHeld && c.LookupRequired && c.StripePaymentIntentID == nil {
			// The look-up that billingctl recover's mark asks for is done:
			// nothing carries the key, so an operator may cancel it.
			if res.Charge, err = l.ChargeLookupDone(ctx, c.ID, "reconciler"); err != nil {
				return nil, err
			}
			res.Action = "looked_up"
			return res, nil
		}
		if !c.Status.Chargeable() {
			res.Action = "unchanged"
			return res, nil
		}
		if c.LeaseLive() {
			return res, nil // a live worker is on it
		}
		if err := l.ChargeJobRunNow(ctx, c.ID); err != nil {
			return nil, err
		}
		res.Action = "requeued"
		return res, nil
	}
	applied, err := l.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Outcome: o, Actor: "reconciler"})
	if err != nil {
		return nil, err
	}
	res.Charge, res.Action = applied.Charge, "unchanged"
	switch {
	case applied.DoubleCharge != nil:
		res.Action = "double_charge" // held if it was not final; alerted by the ledger either way
	case applied.Changed:
		res.Action = "resolved"
	}
	return res, nil
}

// chargeStripeFind returns what Stripe has of charge c: its PaymentIntent
// when the ledger knows it, else the PaymentIntents carrying its key.
func chargeStripeFind(ctx context.Context, s Stripe, c *ledger.Charge) ([]*stripe.PaymentIntent, error) {
	if c.StripePaymentIntentID == nil {
		return chargePaymentIntents(ctx, s, c)
	}
	pi, err := s.PaymentIntentGet(ctx, *c.StripePaymentIntentID)
	if err != nil {
		return nil, fmt.Errorf("error retrieving PaymentIntent %s: %w", *c.StripePaymentIntentID, err)
	}
	return []*stripe.PaymentIntent{pi}, nil
}

func paymentIntentIDs(pis []*stripe.PaymentIntent) []string {
	ids := make([]string, len(pis))
	for i, pi := range pis {
		ids[i] = pi.ID
	}
	return ids
}

func customerOf(pi *stripe.PaymentIntent) string {
	if pi.Customer == nil {
		return "no customer"
	}
	return pi.Customer.ID
}
