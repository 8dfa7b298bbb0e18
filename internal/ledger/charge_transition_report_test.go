package ledger_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// Charge transitions are reported (for tally_charge_transitions_total) once
// their transaction commits, and never for one rolled back.
func TestChargeTransitionReports(t *testing.T) {
	var mu sync.Mutex
	var reported []string
	config := ledger.Config{OnChargeTransition: func(from, to string) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, from+"→"+to)
	}}
	ctx, b, _ := guardBundle(t, config)
	c := closedWith(t, ctx, b, "acme", 1000)
	require.Equal(t, []string{"→pending"}, reported, "the close created the charge")

	claim, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
	require.NoError(t, err)
	claim, err = b.Ledger.ChargeLookupNone(ctx, claim, "job:1/1")
	require.NoError(t, err)

	succeeded := ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_1", HTTPStatus: 200}
	crash := errors.New("crashed before the job completed")
	_, err = b.Ledger.ChargeRecordOutcome(ctx, claim, succeeded, "job:1/1", func(context.Context, *ledger.Tx) error { return crash })
	require.ErrorIs(t, err, crash)
	require.Equal(t, []string{"→pending"}, reported, "nothing reported for a rolled-back outcome")

	got, err := b.Ledger.ChargeRecordOutcome(ctx, claim, succeeded, "job:1/1", nil)
	require.NoError(t, err)
	require.Equal(t, ledger.ChargeSucceeded, got.Status)
	require.Equal(t, []string{"→pending", "pending→succeeded"}, reported)
}
