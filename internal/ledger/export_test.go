package ledger

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// Statements whose plans tests hold to an index.
const (
	UsageEventInsertOpenSQL = usageEventInsertOpenSQL
	ChargeHistorySQL        = chargeHistorySQL
)

// PeriodCloseInSavepoint closes a period inside a savepoint of a ledger
// transaction that commits, the savepoint rolled back when rollback: a
// notice recorded in a savepoint must be written exactly when the savepoint
// is.
func (l *Ledger) PeriodCloseInSavepoint(ctx context.Context, p PeriodCloseParams, rollback bool) error {
	errRollback := errors.New("roll the savepoint back")
	return l.withTx(ctx, func(tx pgx.Tx) error {
		err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if _, err := l.periodCloseTx(ctx, sp, l.now(), p); err != nil {
				return err
			}
			if rollback {
				return errRollback
			}
			return nil
		})
		if errors.Is(err, errRollback) {
			return nil
		}
		return err
	})
}

// WithTx runs fn in a ledger transaction (withTx), for the tests of its
// pipelining; LaterExec and LaterRow queue statements in it.
func (l *Ledger) WithTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return l.withTx(ctx, fn)
}

var (
	LaterExec = laterExec
	LaterRow  = laterRow
)

// APIKeyUnknownMax is how many unknown secrets a Ledger remembers.
const APIKeyUnknownMax = apiKeyUnknownMax

// APIKeyCreateWithSecret creates a key as APIKeyCreate does, with secret
// (tly_<10 hex>_…) instead of a random one: a test can send the secret
// before its key exists.
func (l *Ledger) APIKeyCreateWithSecret(ctx context.Context, name string, scopes []Scope, secret string) (*APIKey, error) {
	return l.apiKeyInsert(ctx, name, scopes, secret[:len("tly_")+10], secret)
}

// APIKeyUnknownCached returns how many unknown secrets l remembers.
func (l *Ledger) APIKeyUnknownCached() int {
	l.apiKeys.mu.Lock()
	defer l.apiKeys.mu.Unlock()
	return len(l.apiKeys.unknown)
}
