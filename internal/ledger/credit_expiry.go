package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A grant stops applying at its expires_at: a period that ends after it is
// not covered by it. What is left of it then is breakage, for finance: an
// expired entry of minus what is left, written by the sweep
// (CreditGrantsExpire) once no open period of the customer could still
// apply the grant (one that ended before expires_at and is not closed yet:
// its close judges grants at its end).

// GrantExpiry is a grant CreditGrantsExpire expired.
type GrantExpiry struct {
	CustomerID string
	GrantID    string
	Currency   string
	// AmountCents is what was left and expired (positive).
	AmountCents int64
	ExpiresAt   time.Time
}

// creditExpireBatch bounds the grants one CreditGrantsExpire looks at; the
// next run takes the rest.
const creditExpireBatch = 500

// CreditGrantsExpire writes the expired entry of each grant past its
// expires_at (at now) with something left that no open period can still
// apply, one transaction per grant, and notifies credit.grant_expired. It
// returns the grants it expired; an error stops it (the next run goes on).
func (l *Ledger) CreditGrantsExpire(ctx context.Context, actor string) ([]GrantExpiry, error) {
	now := l.now()
	rows, err := l.pool.Query(ctx, `
SELECT g.customer_id, g.grant_id FROM billing.credit_grants g`+creditLastEntry+`
WHERE `+creditExpirable+`
ORDER BY g.expires_at, g.customer_id, g.grant_id
LIMIT $2`, now, creditExpireBatch)
	if err != nil {
		return nil, fmt.Errorf("error finding expired grants: %w", err)
	}
	type key struct{ customer, grant string }
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (key, error) {
		var k key
		return k, row.Scan(&k.customer, &k.grant)
	})
	if err != nil {
		return nil, fmt.Errorf("error finding expired grants: %w", err)
	}
	var out []GrantExpiry
	for _, k := range keys {
		var ex *GrantExpiry
		err := l.withTx(ctx, func(tx *Tx) error {
			var err error
			ex, err = creditGrantExpireTx(ctx, tx, now, k.customer, k.grant, actor)
			return err
		})
		if err != nil {
			return out, fmt.Errorf("error expiring grant %q of customer %q: %w", k.grant, k.customer, err)
		}
		if ex != nil {
			out = append(out, *ex)
		}
	}
	return out, nil
}

// creditExpirable is when grant g, joined to its last entry
// (creditLastEntry), expires at $1: past its expires_at, with something
// left, and no open period of its customer in its currency that ended by
// then (whose close may still apply it).
const creditExpirable = `g.expires_at <= $1 AND last.remaining_cents > 0
  AND NOT EXISTS (SELECT 1 FROM billing.periods p
                  WHERE p.customer_id = g.customer_id AND p.currency = g.currency AND p.status = 'open'
                    AND p.ends_at <= g.expires_at)`

// creditGrantExpireTx expires grant (customerID, grantID), as
// CreditGrantsExpire found it, once it holds its lock: nil when it is no
// longer creditExpirable (a close or a void took what was left meanwhile,
// or a period that could apply it opened: an event back-dated into it).
func creditGrantExpireTx(ctx context.Context, tx *Tx, now time.Time, customerID, grantID, actor string) (*GrantExpiry, error) {
	ex := GrantExpiry{CustomerID: customerID, GrantID: grantID}
	err := tx.QueryRow(ctx, `
SELECT currency, expires_at FROM billing.credit_grants WHERE customer_id = $1 AND grant_id = $2 FOR UPDATE`,
		customerID, grantID).Scan(&ex.Currency, &ex.ExpiresAt)
	if err != nil {
		return nil, fmt.Errorf("error locking grant: %w", err)
	}
	// What is left, read in a statement after the lock's.
	var seq int32
	err = tx.QueryRow(ctx, `
SELECT last.seq, last.remaining_cents FROM billing.credit_grants g`+creditLastEntry+`
WHERE g.customer_id = $2 AND g.grant_id = $3 AND `+creditExpirable, now, customerID, grantID).Scan(&seq, &ex.AmountCents)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("error reading grant: %w", err)
	}
	_, err = tx.Exec(ctx, `
INSERT INTO billing.credit_grant_entries (customer_id, grant_id, seq, kind, amount_cents, remaining_cents, actor, created_at)
VALUES ($1, $2, $3, 'expired', $4, 0, $5, $6)`, customerID, grantID, seq+1, -ex.AmountCents, actor, now)
	if err != nil {
		return nil, fmt.Errorf("error writing expired entry: %w", err)
	}
	recordNotice(tx, notice{typ: NotifyCreditGrantExpired, customerID: customerID, grantID: grantID})
	return &ex, nil
}
