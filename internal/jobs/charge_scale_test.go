package jobs_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// TestChargeManyCustomers closes one period for many customers at once and
// checks the simulator's own record against the ledger: exactly one
// PaymentIntent per customer, for exactly the sum of its events.
// TALLY_SCALE_CUSTOMERS sets how many (make test: 200; make scale: 1000).
func TestChargeManyCustomers(t *testing.T) {
	t.Parallel()
	n := 200
	if v := os.Getenv("TALLY_SCALE_CUSTOMERS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	ctx, b := setup(t, setupOpts{})
	b.startWorker(t, ctx) // two replicas

	// Three events per customer, posted in mixed batches of up to 999.
	var batch []ledger.UsageEventParams
	flush := func() {
		if len(batch) > 0 {
			_, err := b.Ledger.UsageEventRecordBatch(ctx, batch)
			require.NoError(t, err)
			batch = batch[:0]
		}
	}
	for i := range n {
		id := fmt.Sprintf("cust-%04d", i)
		b.Customer(t, id)
		for j := range 3 {
			batch = append(batch, ledger.UsageEventParams{CustomerID: id, EventID: fmt.Sprintf("e%d", j), AmountCents: int64(100 + i*7 + j)})
		}
		if len(batch) >= 999 {
			flush()
		}
	}
	flush()

	// Every period's close time arrives at once.
	start := time.Now()
	rows, err := b.Pool.Query(ctx, `SELECT charge_job_id FROM billing.periods`)
	require.NoError(t, err)
	var jobIDs []int64
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		jobIDs = append(jobIDs, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, jobIDs, n)
	for _, id := range jobIDs {
		_, err := b.River.JobRetry(ctx, id)
		require.NoError(t, err)
	}
	b.waitJobsFinalized(t)
	t.Logf("%d charges settled in %s (informational)", n, time.Since(start).Round(time.Millisecond))

	// The simulator's record, checked against sums computed here from the
	// ledger's events, independently of the charge rows.
	sums := map[string]int64{}
	rows, err = b.Pool.Query(ctx, `SELECT customer_id, sum(amount_cents)::bigint FROM billing.usage_events GROUP BY customer_id`)
	require.NoError(t, err)
	for rows.Next() {
		var c string
		var s int64
		require.NoError(t, rows.Scan(&c, &s))
		sums[c] = s
	}
	require.NoError(t, rows.Err())

	pis := b.sim.PaymentIntentList()
	require.Len(t, pis, n, "exactly one PaymentIntent per customer")
	seen := map[string]bool{}
	for _, pi := range pis {
		c := pi.Metadata["customer_id"]
		require.False(t, seen[c], "second PaymentIntent for %s", c)
		seen[c] = true
		require.Equal(t, sums[c], pi.Amount, "amount of %s", c)
		require.Equal(t, "succeeded", string(pi.Status))
	}
	require.Equal(t, int64(n), b.Count(t, `SELECT count(*) FROM billing.charges WHERE status = 'succeeded'`))
	require.Zero(t, b.Count(t, `
SELECT count(*) FROM billing.charges c
WHERE c.amount_cents <> (SELECT sum(amount_cents) FROM billing.usage_events e WHERE e.customer_id = c.customer_id AND e.period = c.period)`))
}
