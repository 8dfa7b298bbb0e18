package jobs_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// v1Charge closes acme's period with no worker running and rewrites its
// charge as one created before namespaces: v1 keys, no key_namespace.
func (b *testBundle) v1Charge(t *testing.T, ctx context.Context) *ledger.Charge {
	t.Helper()
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "operator:test"})
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `
UPDATE billing.charges SET key_namespace = NULL, charge_key = $2, idempotency_key = $3 WHERE id = $1`,
		c.ID, ledger.ChargeKey("", "acme", "2026-11"), ledger.ChargeIdempotencyKey("", "acme", "2026-11", 0))
	require.NoError(t, err)
	return c
}

// TestChargeV1Key runs charges keyed before namespaces (v1 keys, no
// key_namespace) through the look-up before their first call: they must
// charge with their own v1 key, not panic.
func TestChargeV1Key(t *testing.T) {
	t.Parallel()

	t.Run("ApprovedHoldCharges", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		require.NoError(t, b.worker.Stop(ctx))
		b.customerWithEvents(t, ctx, "acme", 700)
		c := b.v1Charge(t, ctx)
		// Held by the guards at its claim, as the anomaly guard does.
		_, err := b.Pool.Exec(ctx, `
UPDATE billing.charges SET status = 'held', held_reason = 'anomaly', held_detail = 'far above usual', held_at = now()
WHERE id = $1`, c.ID)
		require.NoError(t, err)

		b.startWorker(t, ctx)
		_, err = b.Ledger.ChargeApprove(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:test", Reason: "known customer"})
		require.NoError(t, err)
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		pis := b.sim.PaymentIntentList()
		require.Len(t, pis, 1)
		require.Equal(t, ledger.ChargeKey("", "acme", "2026-11"), pis[0].Metadata["tally_charge_key"])
		require.Empty(t, pis[0].Metadata["tally_namespace"])
		require.Equal(t, pis[0].ID, *c.StripePaymentIntentID)
		b.waitJobsFinalized(t)
	})

	t.Run("NeverAttemptedCharges", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		require.NoError(t, b.worker.Stop(ctx))
		b.customerWithEvents(t, ctx, "acme", 700)
		c := b.v1Charge(t, ctx)
		require.Equal(t, ledger.ChargePending, c.Status)

		b.startWorker(t, ctx)
		require.NoError(t, b.Ledger.ChargeJobRunNow(ctx, c.ID))
		c = b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
		require.Equal(t, ledger.ChargeIdempotencyKey("", "acme", "2026-11", 0), c.IdempotencyKey)
		require.Equal(t, []string{"succeeded"}, b.attempts(t, ctx, c.ID))
		b.waitJobsFinalized(t)
	})
}
