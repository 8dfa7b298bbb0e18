package ledger_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// TestTopUpCreateConcurrent posts one top-up from many clients at once, as
// a producer retrying through two API replicas does: one post creates it and
// every other is answered with it. None may fail on a unique index the
// insert's ON CONFLICT did not name (the top-up key's, a 500 in the chaos
// run of 2026-12-07).
func TestTopUpCreateConcurrent(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	const clients = 8
	for round := range 100 {
		id := fmt.Sprintf("tu-%d", round)
		var created atomic.Int32
		errs := make([]error, clients)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, c, err := b.Ledger.TopUpCreate(ctx, ledger.TopUpParams{CustomerID: "acme", TopUpID: id, AmountCents: 5000,
					Actor: "operator:test"})
				if c {
					created.Add(1)
				}
				errs[i] = err
			}()
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err, "round %d", round)
		}
		require.Equal(t, int32(1), created.Load(), "round %d: one post creates the top-up", round)
	}
	require.Equal(t, int64(100), b.Count(t, `SELECT count(*) FROM billing.top_ups`))
}
