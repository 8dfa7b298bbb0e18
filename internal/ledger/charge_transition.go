package ledger

import (
	"context"
	"fmt"
	"time"
)

// transitionTx logs a status change of charge chargeID of customerID and
// who made it (from is nil for its creation). It refuses a change the status
// machine does not allow for actor (chargeTransitions): that is a bug, and
// Postgres would refuse it too.
func transitionTx(ctx context.Context, tx *Tx, now time.Time, chargeID int64, customerID string, from *ChargeStatus, to ChargeStatus,
	actor, reason string) error {
	if from != nil && !ChargeTransitionAllowed(*from, to, actorKind(actor)) {
		return fmt.Errorf("charge %d: %s may not move it from %s to %s", chargeID, actor, *from, to)
	}
	var r *string
	if reason != "" {
		r = &reason
	}
	// Nothing reads it back in the transaction: it goes with the next statement.
	tx.execLater(nil, `
INSERT INTO billing.charge_transitions (charge_id, customer_id, from_status, to_status, actor, reason, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)`, chargeID, customerID, from, to, actor, r, now)
	tx.recordTransition(from, to)
	if to.settles() && (from == nil || !from.settles()) {
		statementIssueTx(tx, chargeID, customerID, now)
	}
	if typ := chargeNotification(to); typ != "" && (from == nil || *from != to) {
		recordNotice(tx, notice{typ: typ, chargeID: chargeID}) // a status change, not a note on the same status
	}
	return nil
}
