package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// BenchmarkPeriodLock compares, under one hot customer, the two ways
// ingest could hold its period against a close (docs/design.md, Ingest):
// FOR KEY SHARE on the period row (what Tally does) and a shared
// transaction-level advisory lock keyed by customer and period. Each op is one ingest-shaped
// transaction — take the period lock, insert one event — from parallel
// clients on one period. Compare the two ns/op of one run (the machine is
// noisy; only the ratio means something):
//
//	go test -run '^$' -bench BenchmarkPeriodLock -benchtime 3000x ./internal/ledger/
func BenchmarkPeriodLock(b *testing.B) {
	lb := ledgertest.New(b, ledger.Config{})
	ctx := context.Background()
	lb.Customer(b, "hot")
	_, err := lb.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "hot", EventID: "seed", AmountCents: 1})
	require.NoError(b, err)
	var seq atomic.Int64

	insert := func(tx pgx.Tx) error {
		n := seq.Add(1)
		_, err := tx.Exec(ctx, `
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, occurred_at, received_at, payload_hash)
VALUES ('hot', $1, '2026-11', 1, 'usd', now(), now(), decode(repeat('00', 32), 'hex'))`, fmt.Sprint("e", n))
		return err
	}
	run := func(b *testing.B, lock func(tx pgx.Tx) error) {
		b.SetParallelism(4) // 4 × GOMAXPROCS concurrent clients on one period
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := pgx.BeginFunc(ctx, lb.Pool, func(tx pgx.Tx) error {
					if err := lock(tx); err != nil {
						return err
					}
					return insert(tx)
				}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}

	b.Run("ForKeyShare", func(b *testing.B) {
		run(b, func(tx pgx.Tx) error {
			var status string
			return tx.QueryRow(ctx, `SELECT status FROM billing.periods WHERE customer_id = 'hot' AND period = '2026-11' FOR KEY SHARE`).Scan(&status)
		})
	})
	b.Run("AdvisoryShared", func(b *testing.B) {
		run(b, func(tx pgx.Tx) error {
			var status string
			return tx.QueryRow(ctx, `
SELECT p.status FROM billing.periods p, pg_advisory_xact_lock_shared(hashtextextended('hot:2026-11', 0))
WHERE p.customer_id = 'hot' AND p.period = '2026-11'`).Scan(&status)
		})
	})
}
