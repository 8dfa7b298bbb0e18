package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every settled charge (succeeded, or covered by credits) has a statement:
// what it billed, line by line, with the credits applied per grant, the
// PaymentIntent and its refunds. Its number is taken when the charge
// settles, in that transaction (statementIssueTx, from transitionTx), from
// one counter row: numbers run from 1 per deployment without gaps, in the
// order charges settle, and are never reused (billing.statements is
// append-only).

// statementIssueTx numbers the statement of charge chargeID of customerID,
// the next number, unless it has one. The counter's row stays locked until
// the transaction ends, so a rollback gives the number back, and every
// settling transaction waits for it: the statement goes last, just before
// the COMMIT (execAtCommit), so that the row is held for the commit alone.
func statementIssueTx(tx *Tx, chargeID int64, customerID string, now time.Time) {
	tx.execAtCommit(`
WITH n AS (
    UPDATE billing.statement_counter SET last_number = last_number + 1
    WHERE NOT EXISTS (SELECT 1 FROM billing.statements WHERE charge_id = $1 AND customer_id = $2)
    RETURNING last_number)
INSERT INTO billing.statements (number, charge_id, customer_id, issued_at) SELECT last_number, $1, $2, $3 FROM n`, chargeID, customerID, now)
}

// settles reports whether a charge moving to status settles it: a
// statement is issued then.
func (s ChargeStatus) settles() bool { return s == ChargeSucceeded || s == ChargeCovered }

// Statement is a settled charge's statement.
type Statement struct {
	Number   int64
	IssuedAt time.Time
	Charge   *Charge
	// Lines are the charge's lines, credits included (ChargeLineCredit).
	Lines   []ChargeLine
	Refunds []*Refund
}

// ChargeStatement returns charge chargeID's statement: a *NotFoundError
// for no such charge, a *ConflictError charge_not_settled for a charge that
// has not settled (yet).
func (l *Ledger) ChargeStatement(ctx context.Context, chargeID int64) (*Statement, error) {
	c, err := l.ChargeGet(ctx, chargeID)
	if err != nil {
		return nil, err
	}
	st := Statement{Charge: c}
	err = l.pool.QueryRow(ctx, `SELECT number, issued_at FROM billing.statements WHERE charge_id = $1`, chargeID).
		Scan(&st.Number, &st.IssuedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, &ConflictError{Code: ConflictChargeNotSettled, Detail: fmt.Sprintf(
			"charge %d is %s: a statement is issued when a charge settles (succeeded, or covered by credits)", chargeID, c.Status)}
	}
	if err != nil {
		return nil, fmt.Errorf("error reading the statement of charge %d: %w", chargeID, err)
	}
	if st.Lines, err = l.ChargeLines(ctx, chargeID); err != nil {
		return nil, err
	}
	if st.Refunds, err = l.RefundListByCharge(ctx, chargeID); err != nil {
		return nil, err
	}
	return &st, nil
}
