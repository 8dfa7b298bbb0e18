package jobs

import (
	"context"
	"fmt"

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
}

// RecoverItem is one charge Recover looked at.
type RecoverItem struct {
	// Before is the charge's status before Recover.
	Before ledger.ChargeStatus

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
func Recover(ctx context.Context, l *ledger.Ledger, s Stripe, p RecoverParams) ([]RecoverItem, error) {
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
	items := make([]RecoverItem, 0, len(todo))
	for _, c := range todo {
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
