package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// OperationsSnapshot is the state every replica's gauges show, as one
// replica last took it.
type OperationsSnapshot struct {
	// State is what take returned, as JSON.
	State json.RawMessage

	// TakenAt is Postgres' clock when it was taken; Now when it was read.
	TakenAt, Now time.Time
}

// operationsSnapshotLock is the key (in the two-int keyspace, apart from
// the bigint keys of the period budget) of the transaction-level advisory
// lock under which one replica takes the snapshot.
const operationsSnapshotLockClass, operationsSnapshotLockID = 0x7a11e, 1

// OperationsSnapshotGet returns the snapshot shared by every replica,
// taken again with take when it is maxAge old or older. One replica takes
// it — the one that wins an advisory lock — while the others answer the one
// stored, however old (its age says so); only before the first snapshot
// exists does a replica that lost the lock take one for itself without
// storing it. So the state's reads cost the same whatever the number of
// replicas.
func (l *Ledger) OperationsSnapshotGet(ctx context.Context, maxAge time.Duration, take func(context.Context) (json.RawMessage, error)) (*OperationsSnapshot, error) {
	snap, err := operationsSnapshotRead(ctx, l.pool)
	if err != nil {
		return nil, err
	}
	if snap != nil && snap.Now.Sub(snap.TakenAt) < maxAge {
		return snap, nil
	}
	err = l.withTx(ctx, func(tx *Tx) error {
		var locked bool
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, $2), now()`,
			operationsSnapshotLockClass, operationsSnapshotLockID).Scan(&locked, &now); err != nil {
			return fmt.Errorf("error taking the snapshot lock: %w", err)
		}
		if locked {
			// Another replica may have stored a fresh one meanwhile.
			again, err := operationsSnapshotRead(ctx, tx)
			if err != nil {
				return err
			}
			if again != nil && again.Now.Sub(again.TakenAt) < maxAge {
				snap = again
				return nil
			}
		} else if snap != nil {
			return nil // another replica is taking it: the stored one will do
		}
		state, err := take(ctx)
		if err != nil {
			return err
		}
		snap = &OperationsSnapshot{State: state, TakenAt: now, Now: now}
		if !locked {
			return nil
		}
		if err := tx.QueryRow(ctx, `
INSERT INTO billing.operations_snapshot (id, state, taken_at) VALUES (1, $1, clock_timestamp())
ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, taken_at = EXCLUDED.taken_at
RETURNING taken_at, clock_timestamp()`, state).Scan(&snap.TakenAt, &snap.Now); err != nil {
			return fmt.Errorf("error storing the operations snapshot: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error taking the operations snapshot: %w", err)
	}
	return snap, nil
}

// operationsSnapshotRead reads the stored snapshot, or nil when none is.
func operationsSnapshotRead(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (*OperationsSnapshot, error) {
	var snap OperationsSnapshot
	err := db.QueryRow(ctx, `SELECT state, taken_at, now() FROM billing.operations_snapshot WHERE id = 1`).
		Scan(&snap.State, &snap.TakenAt, &snap.Now)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("error reading the operations snapshot: %w", err)
	}
	return &snap, nil
}
