package ledger_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// One crossing of the threshold starts one top-up, however many checks race
// for it (a close and roll-ups on several replicas); a grant that brings
// the balance back arms the next.
func TestRechargeOncePerCrossing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := ledgertest.New(t, ledger.Config{})
	below, to := int64(500), int64(2000)
	_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd",
		RechargeBelowCents: &below, RechargeToCents: &to})
	require.NoError(t, err)
	_, _, err = b.Ledger.CreditGrantCreate(ctx, ledger.CreditGrantParams{CustomerID: "acme", GrantID: "g", AmountCents: 600,
		Currency: "usd", Category: ledger.CreditPaid, Actor: "test"})
	require.NoError(t, err)

	t.Log("above the threshold: nothing")
	tu, err := b.Ledger.RechargeCheck(ctx, "acme", 100)
	require.NoError(t, err)
	require.Nil(t, tu)

	t.Log("eight checks race for one crossing")
	var wg sync.WaitGroup
	started := make(chan *ledger.TopUp, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tu, err := b.Ledger.RechargeCheck(ctx, "acme", 250)
			if err != nil {
				t.Error(err)
			}
			started <- tu
		}()
	}
	wg.Wait()
	close(started)
	var n int
	for tu := range started {
		if tu != nil {
			n++
			require.Equal(t, "recharge-1", tu.TopUpID)
			require.Equal(t, int64(1650), tu.AmountCents)
		}
	}
	require.Equal(t, 1, n)
	require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.top_ups`))

	t.Log("still below, not re-armed: nothing")
	tu, err = b.Ledger.RechargeCheck(ctx, "acme", 400)
	require.NoError(t, err)
	require.Nil(t, tu)

	t.Log("a grant that brings the balance back arms the next crossing")
	_, _, err = b.Ledger.CreditGrantCreate(ctx, ledger.CreditGrantParams{CustomerID: "acme", GrantID: "g2", AmountCents: 1000,
		Currency: "usd", Category: ledger.CreditPaid, Actor: "test"})
	require.NoError(t, err)
	tu, err = b.Ledger.RechargeCheck(ctx, "acme", 1500)
	require.NoError(t, err)
	require.NotNil(t, tu)
	require.Equal(t, "recharge-2", tu.TopUpID)
	require.Equal(t, int64(1900), tu.AmountCents, "2000 less the projected 1600 - 1500")
}
