package stripesim

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
)

// eventsAfter decodes data.object of every event after the first n, with
// the events' types.
func eventsAfter(t *testing.T, sim *Server, n int) ([]string, []map[string]any) {
	t.Helper()
	var types []string
	var objects []map[string]any
	for _, ev := range sim.EventList()[n:] {
		var e stripe.Event
		require.NoError(t, json.Unmarshal(ev.Payload, &e))
		types = append(types, string(e.Type))
		objects = append(objects, e.Data.Object)
	}
	return types, objects
}

func TestStatusUpdate(t *testing.T) {
	t.Parallel()

	ctx := context.Background()

	t.Run("DisputeClosed", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "k1")
		dp, err := bundle.sim.ChargeDispute(pi.LatestCharge.ID)
		require.NoError(t, err)
		n := len(bundle.sim.EventList())

		_, err = bundle.sim.DisputeUpdate(dp.ID, "needs_response")
		require.ErrorIs(t, err, ErrConflict, "no change to the same status")
		got, err := bundle.sim.DisputeUpdate(dp.ID, "under_review")
		require.NoError(t, err)
		require.Equal(t, stripe.DisputeStatusUnderReview, got.Status)
		got, err = bundle.sim.DisputeUpdate(dp.ID, "lost")
		require.NoError(t, err)
		require.Equal(t, stripe.DisputeStatusLost, got.Status)
		_, err = bundle.sim.DisputeUpdate(dp.ID, "won")
		require.ErrorIs(t, err, ErrConflict, "a closed dispute stays closed")

		types, objects := eventsAfter(t, bundle.sim, n)
		require.Equal(t, []string{"charge.dispute.updated", "charge.dispute.closed"}, types)
		require.Equal(t, dp.ID, objects[1]["id"])
		require.Equal(t, "lost", objects[1]["status"])
		require.Equal(t, "under_review", objects[0]["status"])
	})

	t.Run("DisputeNotFound", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		_, err := bundle.sim.DisputeUpdate("dp_missing", "won")
		require.ErrorIs(t, err, ErrNotFound)
	})

	t.Run("RefundFailsAfterSucceeded", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		pi := createSucceeded(ctx, t, bundle, "cus_a", 1000, "k1")
		ch, err := bundle.sim.ChargeRefund(pi.LatestCharge.ID, 0)
		require.NoError(t, err)
		require.True(t, ch.Refunded)
		re := ch.Refunds.Data[0]
		n := len(bundle.sim.EventList())

		got, err := bundle.sim.RefundUpdate(re.ID, "failed")
		require.NoError(t, err)
		require.Equal(t, stripe.RefundStatusFailed, got.Status)
		_, err = bundle.sim.RefundUpdate(re.ID, "succeeded")
		require.ErrorIs(t, err, ErrConflict, "a failed refund stays failed")

		types, objects := eventsAfter(t, bundle.sim, n)
		require.Equal(t, []string{"refund.updated", "charge.refund.updated"}, types)
		for _, o := range objects {
			require.Equal(t, re.ID, o["id"])
			require.Equal(t, "failed", o["status"])
		}
		// The failed amount is back on the charge: it can be refunded again.
		ch, err = bundle.sim.ChargeRefund(pi.LatestCharge.ID, 1000)
		require.NoError(t, err)
		require.Equal(t, int64(1000), ch.AmountRefunded)
	})

	t.Run("RefundNotFound", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, nil)
		_, err := bundle.sim.RefundUpdate("re_missing", "failed")
		require.ErrorIs(t, err, ErrNotFound)
	})
}
