package ledger

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Statements whose plans tests hold to an index.
const (
	UsageEventInsertOpenSQL  = usageEventInsertOpenSQL
	UsageEventsInsertOpenSQL = usageEventsInsertOpenSQL
	UsageEventInsertOpenCall = usageEventInsertOpenCall
	ChargeHistorySQL         = chargeHistorySQL
	PeriodSelectSQL          = periodSelectSQL
)

// PeriodCloseInSavepoint closes a period inside a savepoint of a ledger
// transaction that commits, the savepoint rolled back when rollback: a
// notice recorded in a savepoint must be written exactly when the savepoint
// is.
func (l *Ledger) PeriodCloseInSavepoint(ctx context.Context, p PeriodCloseParams, rollback bool) error {
	errRollback := errors.New("roll the savepoint back")
	return l.withTx(ctx, func(tx *Tx) error {
		err := tx.savepoint(ctx, func(sp *Tx) error {
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

// Later is a queued statement's result; Get reads it.
type Later[T any] = later[T]

func (d *later[T]) Get(ctx context.Context) (T, error) { return d.get(ctx) }

// ExecLaterChecked queues sql in tx with check (execLater).
func ExecLaterChecked(tx *Tx, check func(pgconn.CommandTag) error, sql string, args ...any) {
	tx.execLater(check, sql, args...)
}

// ExecAtCommit queues sql in tx for its commit (execAtCommit).
func ExecAtCommit(tx *Tx, sql string, args ...any) { tx.execAtCommit(sql, args...) }

// QueryRowLater queues sql in tx (queryRowLater).
func QueryRowLater[T any](tx *Tx, scan func(pgx.Row) (T, error), sql string, args ...any) *Later[T] {
	return queryRowLater(tx, scan, sql, args...)
}

// Savepoint runs fn in a savepoint of tx (savepoint).
func (tx *Tx) Savepoint(ctx context.Context, fn func(sp *Tx) error) error {
	return tx.savepoint(ctx, fn)
}

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

// RechargeCheck runs the automatic recharge's check of customerID in a
// transaction of its own, with projectedCents of open usage, and returns the
// top-up it started (nil: none).
func (l *Ledger) RechargeCheck(ctx context.Context, customerID string, projectedCents int64) (*TopUp, error) {
	var t *TopUp
	err := l.withTx(ctx, func(tx *Tx) error {
		var err error
		t, err = l.rechargeCheckTx(ctx, tx, l.now(), customerID, "test", projectedCents)
		return err
	})
	return t, err
}

// IngestQueued is how many single events wait for a writer of their group.
func (l *Ledger) IngestQueued() int {
	l.groups.mu.Lock()
	defer l.groups.mu.Unlock()
	return len(l.groups.queue)
}
