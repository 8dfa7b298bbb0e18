package main

import (
	"maps"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripeapi"
	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// TestRecover restores nothing itself: it builds the state a restore leaves
// (charges that look never attempted, whose PaymentIntents Stripe has) and
// checks what billingctl recover reports and changes.
func TestRecover(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := newRecoverBundle(t, nil)
	l, env, s := b.l, b.env, b.stripe

	// Closed, pending charges: "paid" was charged before the restore and
	// Stripe has its PaymentIntent; "twice" has two; "fresh" has none.
	charges := map[string]*ledger.Charge{}
	for _, id := range []string{"paid", "twice", "fresh"} {
		_, _, err := l.CustomerPut(ctx, ledger.CustomerPutParams{ID: id, StripeCustomerID: "cus_" + id, Currency: "usd"})
		require.NoError(t, err)
		_, err = l.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: id, EventID: "e1", AmountCents: 900})
		require.NoError(t, err)
		p, err := l.PeriodList(ctx, id)
		require.NoError(t, err)
		charges[id], err = l.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: id, Period: p[0].Period, Actor: "test"})
		require.NoError(t, err)
	}
	lost := func(c *ledger.Charge) *stripe.PaymentIntent {
		params := &stripe.PaymentIntentParams{Amount: stripe.Int64(c.AmountCents), Currency: stripe.String(c.Currency),
			Customer: stripe.String(c.StripeCustomerID), PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true)}
		params.AddMetadata("tally_charge_key", c.ChargeKey)
		params.AddMetadata("tally_namespace", c.KeyNamespace)
		pi, err := s.PaymentIntentCreate(ctx, params)
		require.NoError(t, err)
		return pi
	}
	paid := lost(charges["paid"])
	lost(charges["twice"])
	lost(charges["twice"])

	billingctl := func(args ...string) (string, string, error) {
		var stdout, stderr strings.Builder
		err := run(ctx, args, env, &stdout, &stderr)
		return stdout.String(), stderr.String(), err
	}

	t.Run("DryRunReportsAndChangesNothing", func(t *testing.T) {
		stdout, stderr, err := billingctl("recover", "--dry-run")
		require.NoError(t, err, stderr)
		require.Contains(t, stdout, "paid/"+charges["paid"].Period+": pending → pending (would resolve); on Stripe: "+paid.ID+" succeeded 900 usd")
		require.Contains(t, stdout, "(would hold)")
		require.Contains(t, stdout, "fresh/"+charges["fresh"].Period+": pending → pending (none found); on Stripe: nothing")
		require.Contains(t, stderr, "looked at 3 charges on Stripe; marked 0")
		for _, c := range charges {
			got, err := l.ChargeGet(ctx, c.ID)
			require.NoError(t, err)
			require.Equal(t, ledger.ChargePending, got.Status)
			require.False(t, got.LookupRequired)
		}
	})

	t.Run("RequiresAReason", func(t *testing.T) {
		_, _, err := billingctl("recover")
		require.ErrorContains(t, err, "--reason is required")
	})

	t.Run("MarksAdoptsAndHolds", func(t *testing.T) {
		stdout, stderr, err := billingctl("recover", "--reason", "restored the 03:00 backup")
		require.NoError(t, err, stderr)
		t.Logf("billingctl recover:\n%s%s", stdout, stderr)
		require.Contains(t, stdout, "pending → succeeded (resolved); on Stripe: "+paid.ID)
		require.Contains(t, stderr, "looked at 3 charges on Stripe; marked 3 for a look-up before their next call")

		got, err := l.ChargeGet(ctx, charges["paid"].ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeSucceeded, got.Status)
		require.Equal(t, paid.ID, *got.StripePaymentIntentID)

		require.Contains(t, stdout, "pending → held (resolved)")
		require.Contains(t, stdout, "ALERT held: double_charge")
		got, err = l.ChargeGet(ctx, charges["twice"].ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeHeld, got.Status)
		require.Contains(t, *got.HeldReason, "double_charge")

		got, err = l.ChargeGet(ctx, charges["fresh"].ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargePending, got.Status)
		require.True(t, got.LookupRequired, "its next call looks at Stripe first")
		require.Contains(t, stdout, "fresh/"+got.Period+": pending → pending (requeued); on Stripe: nothing; marked")

		// Again: the settled charge is no longer looked at.
		stdout, stderr, err = billingctl("recover", "--reason", "again")
		require.NoError(t, err, stderr)
		require.NotContains(t, stdout, "paid/")
		require.Contains(t, stderr, "looked at 2 charges on Stripe")
	})
}

// TestReconcileReadsTheServerSettings settles a charge with billingctl
// reconcile and recover: a decline they find moves the charge as the server
// would with the same TALLY_* settings (past_due under the default dunning
// schedule, failed with TALLY_DUNNING_SCHEDULE=off).
func TestReconcileReadsTheServerSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		schedule string
		command  []string
		want     ledger.ChargeStatus
	}{
		{"ReconcileDefaultSchedule", "", []string{"reconcile"}, ledger.ChargePastDue},
		{"ReconcileDunningOff", "off", []string{"reconcile"}, ledger.ChargeFailed},
		{"RecoverDefaultSchedule", "", []string{"recover", "--reason", "failover"}, ledger.ChargePastDue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := newRecoverBundle(t, map[string]string{"TALLY_DUNNING_SCHEDULE": tc.schedule})
			l, sim, s, env := b.l, b.sim, b.stripe, b.env
			c := b.closedAcme(t)
			// The call whose record was lost: Stripe declined it.
			require.NoError(t, sim.FaultAdd(stripesim.Fault{Customer: "cus_acme", Kind: stripesim.FaultKindDecline, DeclineCode: "insufficient_funds"}))
			params := &stripe.PaymentIntentParams{Amount: stripe.Int64(c.AmountCents), Currency: stripe.String(c.Currency),
				Customer: stripe.String(c.StripeCustomerID), PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true)}
			params.AddMetadata("tally_charge_key", c.ChargeKey)
			params.AddMetadata("tally_namespace", c.KeyNamespace)
			_, err := s.PaymentIntentCreate(ctx, params)
			require.Error(t, err, "declined")

			command := append(tc.command, "--customer", "acme", "--period", c.Period)
			if tc.command[0] == "recover" {
				command = tc.command
			}
			var stdout, stderr strings.Builder
			require.NoError(t, run(ctx, command, env, &stdout, &stderr), stderr.String())
			got, err := l.ChargeGet(ctx, c.ID)
			require.NoError(t, err)
			require.Equal(t, tc.want, got.Status, "billingctl %s:\n%s%s", tc.command[0], stdout.String(), stderr.String())
			if tc.want == ledger.ChargePastDue {
				require.NotNil(t, got.NextRetryAt, "its first retry is scheduled")
			}
		})
	}
}

// TestRecoverHeldChargeKeepsItsExit holds a charge that never called
// Stripe (amount_too_large) and runs billingctl recover over it: the look-up
// recover marks it for is made by recover itself (nothing on Stripe), so the
// hold's exit, cancel, still works; and a mark left by an earlier recover is
// cleared by billingctl reconcile.
func TestRecoverHeldChargeKeepsItsExit(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Recover", "Reconcile"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := newRecoverBundle(t, nil)
			l, pool, env := b.l, b.pool, b.env
			c := b.closedAcme(t)
			// Held before any call, as the guards hold a total Stripe refuses.
			_, err := pool.Exec(ctx, `
UPDATE billing.charges SET status = 'held', held_reason = 'amount_too_large', held_detail = 'too large', held_at = now()
WHERE id = $1`, c.ID)
			require.NoError(t, err)

			var stdout, stderr strings.Builder
			if how == "Recover" {
				require.NoError(t, run(ctx, []string{"recover", "--reason", "restored the 03:00 backup"}, env, &stdout, &stderr), stderr.String())
			} else {
				_, err := l.ChargeLookupMark(ctx, "cli:test", "an earlier recover")
				require.NoError(t, err)
				require.NoError(t, run(ctx, []string{"reconcile", "--customer", "acme", "--period", c.Period}, env, &stdout, &stderr), stderr.String())
				require.Contains(t, stdout.String(), "held → held (looked_up)")
			}
			got, err := l.ChargeGet(ctx, c.ID)
			require.NoError(t, err)
			require.False(t, got.LookupRequired, "%s:\n%s%s", how, stdout.String(), stderr.String())

			canceled, err := l.ChargeCancel(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "cli:test", Reason: "bill it outside Tally"})
			require.NoError(t, err)
			require.Equal(t, ledger.ChargeCanceled, canceled.Status)
		})
	}
}

// recoverBundle is a ledger on a fresh database, the Stripe simulator and
// billingctl's environment pointing at both.
type recoverBundle struct {
	l      *ledger.Ledger
	pool   *pgxpool.Pool
	sim    *stripesim.Server
	stripe *stripeapi.Client
	env    func(string) string
}

// newRecoverBundle returns a recoverBundle whose environment also holds
// extra.
func newRecoverBundle(t *testing.T, extra map[string]string) *recoverBundle {
	t.Helper()
	pool, url := testdb.New(t)
	client, err := jobs.NewInsertClient(pool, nil)
	require.NoError(t, err)
	l, err := ledger.New(pool, ledger.Config{Scheduler: jobs.Scheduler{Client: client}})
	require.NoError(t, err)
	sim := stripesim.New(stripesim.Config{})
	t.Cleanup(sim.Close)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	vars := map[string]string{"DATABASE_URL": url, "STRIPE_API_KEY": "sk_test_recover", "STRIPE_API_BASE": srv.URL}
	maps.Copy(vars, extra)
	return &recoverBundle{l: l, pool: pool, sim: sim, env: func(k string) string { return vars[k] },
		stripe: stripeapi.New(stripeapi.Config{APIKey: "sk_test_recover", BaseURL: srv.URL})}
}

// closedAcme gives customer acme one event of 900 in the current period
// and closes it: its charge, pending and never attempted.
func (b *recoverBundle) closedAcme(t *testing.T) *ledger.Charge {
	t.Helper()
	ctx := t.Context()
	_, _, err := b.l.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd"})
	require.NoError(t, err)
	_, err = b.l.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "e1", AmountCents: 900})
	require.NoError(t, err)
	periods, err := b.l.PeriodList(ctx, "acme")
	require.NoError(t, err)
	c, err := b.l.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: periods[0].Period, Actor: "test"})
	require.NoError(t, err)
	return c
}
