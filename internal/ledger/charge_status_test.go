package ledger_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// TestChargeStatusMachine walks every (from, to) pair of statuses and shows
// that exactly the pairs of the Go table are accepted, by the Go check and by
// Postgres's trigger alike.
func TestChargeStatusMachine(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})

	allowed := map[[2]ledger.ChargeStatus]bool{}
	for _, p := range ledger.ChargeTransitionPairs() {
		allowed[p] = true
	}
	rows, err := b.Pool.Query(ctx, `SELECT from_status, to_status FROM billing.charge_status_transitions`)
	require.NoError(t, err)
	inSQL, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]ledger.ChargeStatus, error) {
		var p [2]ledger.ChargeStatus
		return p, r.Scan(&p[0], &p[1])
	})
	require.NoError(t, err)
	require.Len(t, inSQL, len(allowed), "the SQL table has the Go table's pairs")
	for _, p := range inSQL {
		require.True(t, allowed[p], "%s → %s is in SQL but not in Go", p[0], p[1])
	}

	kinds := []ledger.ActorKind{ledger.ActorJob, ledger.ActorWebhook, ledger.ActorReconciler, ledger.ActorOperator}
	n := 0
	for _, from := range ledger.ChargeStatuses {
		for _, to := range ledger.ChargeStatuses {
			n++
			var anyone bool
			for _, k := range kinds {
				anyone = anyone || ledger.ChargeTransitionAllowed(from, to, k)
			}
			want := from == to || allowed[[2]ledger.ChargeStatus{from, to}]
			require.Equal(t, want, anyone, "Go: %s → %s", from, to)

			// A charge in from (every column its CHECKs could ask for set),
			// then the change to to.
			period := fmt.Sprintf("p%02d", n)
			_, err := b.Pool.Exec(ctx, `
INSERT INTO billing.periods (customer_id, period, currency, starts_at, ends_at, closes_at, status, closed_at, created_at)
VALUES ('acme', $1, 'usd', '2026-11-01', '2026-12-01', '2026-12-01 01:00', 'closed', now(), now())`, period)
			require.NoError(t, err)
			var id int64
			require.NoError(t, b.Pool.QueryRow(ctx, `
INSERT INTO billing.charges (customer_id, period, status, amount_cents, currency, event_count, stripe_customer_id,
                             charge_key, idempotency_key, stripe_payment_intent_id, held_reason, held_at,
                             period_starts_at, past_due_since, next_retry_at, created_at, updated_at)
VALUES ('acme', $1, $2, 0, 'usd', 0, 'cus_acme', $1, $1, 'pi_' || $1, 'anomaly', now(), '2026-11-01', now(), now(), now(), now())
RETURNING id`, period, from).Scan(&id))
			_, err = b.Pool.Exec(ctx, `UPDATE billing.charges SET status = $2 WHERE id = $1`, id, to)
			if want {
				require.NoError(t, err, "Postgres: %s → %s", from, to)
			} else {
				require.ErrorContains(t, err, "may not move", "Postgres: %s → %s", from, to)
			}
		}
	}
	require.Equal(t, len(ledger.ChargeStatuses)*len(ledger.ChargeStatuses), n)
}

func TestChargeTransitionAllowedByActor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		from, to ledger.ChargeStatus
		by       ledger.ActorKind
		want     bool
	}{
		{ledger.ChargeHeld, ledger.ChargePending, ledger.ActorOperator, true},
		{ledger.ChargeHeld, ledger.ChargePending, ledger.ActorJob, false},
		{ledger.ChargePending, ledger.ChargeCanceled, ledger.ActorOperator, true},
		{ledger.ChargePending, ledger.ChargeCanceled, ledger.ActorWebhook, false},
		{ledger.ChargePending, ledger.ChargeUnknown, ledger.ActorWebhook, false},
		{ledger.ChargeFailed, ledger.ChargeSucceeded, ledger.ActorWebhook, true},
		{ledger.ChargeFailed, ledger.ChargeSucceeded, ledger.ActorOperator, false},
		{ledger.ChargeSucceeded, ledger.ChargeFailed, ledger.ActorReconciler, false},
		{ledger.ChargeSucceeded, ledger.ChargeSucceeded, ledger.ActorJob, true},
		{ledger.ChargePastDue, ledger.ChargePending, ledger.ActorJob, true},
		{ledger.ChargePastDue, ledger.ChargePending, ledger.ActorOperator, false}, // an operator asks for a retry; the job makes it
		{ledger.ChargeProcessing, ledger.ChargePastDue, ledger.ActorWebhook, true},
		{ledger.ChargeUncollectible, ledger.ChargeSucceeded, ledger.ActorWebhook, true},
		{ledger.ChargeUncollectible, ledger.ChargePending, ledger.ActorOperator, false},
		{ledger.ChargePastDue, ledger.ChargeFailed, ledger.ActorJob, false},
	} {
		require.Equal(t, tc.want, ledger.ChargeTransitionAllowed(tc.from, tc.to, tc.by), "%s → %s by %s", tc.from, tc.to, tc.by)
	}
	for _, s := range ledger.ChargeStatuses {
		require.Equal(t, slices.Contains([]ledger.ChargeStatus{ledger.ChargePending, ledger.ChargeUnknown}, s), s.Chargeable(), s)
	}
}
