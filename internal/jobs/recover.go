package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
)

// RecoverParams are the fields of Recover.
type RecoverParams struct {
	// Actor is who recovers, for the transitions log (operator:…).
	Actor string

	// Reason says what was lost, such as "restored the 03:00 backup".
	Reason string

	// DryRun looks at Stripe and reports, and changes nothing.
	DryRun bool

	// Since is about when the record was lost: the look for charges the
	// ledger lost lists this namespace's PaymentIntents created since then.
	// Zero: ledger.RecoverSinceDefault.
	Since time.Time
}

// RecoverItem is one charge Recover looked at.
type RecoverItem struct {
	// Before is the charge's status before Recover ("" for a charge the
	// ledger had lost: Lost).
	Before ledger.ChargeStatus

	// Lost is set for a charge the ledger had lost and Stripe had: Recover
	// closed its period and created it from what the ledger holds, then took
	// its PaymentIntents' outcome (or held it). Action is "adopted" (or
	// "would adopt" in a dry run).
	Lost bool

	// Marked is set when the charge was marked for a look-up before its next
	// call (ledger.ChargeLookupMark).
	Marked bool

	// Result is what ReconcileCharge did; in a dry run, Action is
	// "would resolve", "would hold" or "none found", and Charge is unchanged.
	ReconcileResult

	// Err is why the charge could not be reconciled; the others go on.
	Err error
}

// Recover is what an operator runs after Tally's own record may have been
// lost — a restored backup, a failover that dropped the last commits: the
// attempts this database holds may not be all that Stripe saw. It marks every
// charge that may still call Stripe (pending, unknown, held) so its next call
// looks at Stripe first whatever its record shows, then reconciles, one by
// one, every charge not settled in Stripe-confirmed terms (pending, unknown,
// processing, held, failed) against what Stripe has (ReconcileCharge), and
// returns what it found for each. Charges are marked in one transaction
// before any is reconciled. Safe to run any number of times.
//
// First of all it gives back the charges the ledger lost while Stripe kept
// them (recoverLost): a lossy failover can drop a period's close and its
// charge row after the PaymentIntent was created, leaving the period open
// until its natural close, weeks away perhaps, and finance's SQL short of
// what Stripe charged.
func Recover(ctx context.Context, l *ledger.Ledger, s Stripe, p RecoverParams) ([]RecoverItem, error) {
	lost, err := recoverLost(ctx, l, s, p)
	if err != nil {
		return lost, err
	}
	marked := map[int64]bool{}
	if !p.DryRun {
		charges, err := l.ChargeLookupMark(ctx, p.Actor, p.Reason)
		if err != nil {
			return nil, err
		}
		for _, c := range charges {
			marked[c.ID] = true
		}
	}
	// The whole list first: a charge reconciled into another status (pending
	// → held) must not come round again.
	var todo []*ledger.Charge
	for _, status := range reconcileStatuses {
		for after := int64(0); ; {
			charges, more, err := l.ChargeList(ctx, ledger.ChargeListParams{Status: status, AfterID: after, Limit: ledger.ChargeListLimitMax})
			if err != nil {
				return nil, err
			}
			todo = append(todo, charges...)
			if !more {
				break
			}
			after = charges[len(charges)-1].ID
		}
	}
	items := append(make([]RecoverItem, 0, len(lost)+len(todo)), lost...)
	for _, c := range todo {
		if slices.ContainsFunc(lost, func(it RecoverItem) bool { return it.Charge != nil && it.Charge.ID == c.ID }) {
			continue // just recovered
		}
		if err := ctx.Err(); err != nil {
			return items, err
		}
		items = append(items, recoverCharge(ctx, l, s, c, marked[c.ID], p.DryRun))
	}
	return items, nil
}

// recoverCharge reconciles one charge for Recover, or in a dry run only
// says what reconciling would do.
func recoverCharge(ctx context.Context, l *ledger.Ledger, s Stripe, c *ledger.Charge, marked, dryRun bool) RecoverItem {
	item := RecoverItem{Before: c.Status, Marked: marked, ReconcileResult: ReconcileResult{Charge: c}}
	if !dryRun {
		res, err := ReconcileCharge(ctx, l, s, c)
		if err != nil {
			item.Err = fmt.Errorf("error reconciling charge %d: %w", c.ID, err)
			return item
		}
		item.ReconcileResult = *res
		return item
	}
	pis, err := chargeStripeFind(ctx, s, c)
	if err != nil {
		item.Err = err
		return item
	}
	item.PaymentIntents = pis
	switch o, found := reconcileOutcome(c, pis, s.Livemode()); {
	case !found:
		item.Action = "none found"
	case o.Class == ledger.OutcomeHeld:
		item.Action = "would hold"
	default:
		item.Action = "would resolve"
	}
	return item
}

// PaymentIntentSummary describes a PaymentIntent in one phrase for an
// operator: id, status, amount and currency.
func PaymentIntentSummary(pi *stripe.PaymentIntent) string {
	return fmt.Sprintf("%s %s %d %s", pi.ID, pi.Status, pi.Amount, pi.Currency)
}

// recoverLost lists this namespace's PaymentIntents created since p.Since on
// Stripe (every customer's) and, for each charge key whose charge the ledger
// lacks, closes the charge's period and creates the charge from the events
// the ledger holds, taking its PaymentIntents' outcome — held
// payment_intent_mismatch when the restored sum differs from what was
// charged (ledger.ChargeRecoverLost). A dry run only reports them.
func recoverLost(ctx context.Context, l *ledger.Ledger, s Stripe, p RecoverParams) ([]RecoverItem, error) {
	since := p.Since
	if since.IsZero() {
		var err error
		if since, err = l.RecoverSinceDefault(ctx); err != nil {
			return nil, err
		}
	}
	all, err := s.PaymentIntentList(ctx, "", since)
	if err != nil {
		return nil, fmt.Errorf("error listing PaymentIntents since %s: %w", since.Format(time.RFC3339), err)
	}
	type lostCharge struct {
		customerID, period string
		pis                []*stripe.PaymentIntent
	}
	byKey := map[string]*lostCharge{}
	var keys []string
	for _, pi := range all {
		key, customerID, period := pi.Metadata["tally_charge_key"], pi.Metadata["customer_id"], pi.Metadata["period"]
		if key == "" || pi.Metadata["tally_namespace"] != l.Namespace() || key != ledger.ChargeKey(l.Namespace(), customerID, period) {
			continue // not this deployment's charge
		}
		if byKey[key] == nil {
			byKey[key] = &lostCharge{customerID: customerID, period: period}
			keys = append(keys, key)
		}
		byKey[key].pis = append(byKey[key].pis, pi)
	}
	var items []RecoverItem
	for _, key := range keys {
		lc := byKey[key]
		switch _, err := l.ChargeGetByPeriod(ctx, lc.customerID, lc.period); {
		case err == nil:
			continue // the ledger has it: reconciled with the others
		case !errors.Is(err, ledger.ErrNotFound):
			return items, err
		}
		item := RecoverItem{Lost: true, ReconcileResult: ReconcileResult{PaymentIntents: lc.pis, Action: "would adopt",
			Charge: &ledger.Charge{CustomerID: lc.customerID, Period: lc.period}}}
		if !p.DryRun {
			c, created, err := l.ChargeRecoverLost(ctx, ledger.ChargeRecoverLostParams{
				CustomerID: lc.customerID, Period: lc.period, PaymentIntents: paymentIntentIDs(lc.pis),
				Actor: p.Actor, Reason: p.Reason,
				Outcome: func(c *ledger.Charge) ledger.Outcome {
					o, _ := reconcileOutcome(c, lc.pis, s.Livemode())
					return o
				},
			})
			switch {
			case err != nil:
				item.Err = err
			case created:
				item.Charge, item.Action = c, "adopted"
			default:
				continue // created meanwhile (a worker, another recover): reconciled with the others
			}
		}
		items = append(items, item)
	}
	return items, nil
}
