package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/webhook"
)

// topUp buys amount usd of credits for customer id with top_up_id topUpID.
func (b *testBundle) topUp(t *testing.T, ctx context.Context, id, topUpID string, amount int64) *ledger.TopUp {
	t.Helper()
	tu, created, err := b.Ledger.TopUpCreate(ctx, ledger.TopUpParams{CustomerID: id, TopUpID: topUpID, AmountCents: amount,
		Actor: "operator:test"})
	require.NoError(t, err)
	require.True(t, created)
	return tu
}

// waitTopUp polls the top-up until cond holds.
func (b *testBundle) waitTopUp(t *testing.T, ctx context.Context, customerID, topUpID string, cond func(*ledger.TopUp) bool) *ledger.TopUp {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		tu, err := b.Ledger.TopUpGet(ctx, customerID, topUpID)
		if !errors.Is(err, ledger.ErrNotFound) {
			require.NoError(t, err)
		}
		if tu != nil && cond(tu) {
			return tu
		}
		if time.Now().After(deadline) {
			t.Fatalf("top-up %s of %s never reached the expected state; last: %+v", topUpID, customerID, tu)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func topUpIs(status ledger.TopUpStatus) func(*ledger.TopUp) bool {
	return func(tu *ledger.TopUp) bool { return tu.Status == status }
}

// rerunTopUps ends every top-up lease, as time passing after a worker's
// death would, waits until no top-up job is running or about to, and makes
// the snoozed ones run now.
func (b *testBundle) rerunTopUps(t *testing.T, ctx context.Context) {
	t.Helper()
	_, err := b.Pool.Exec(ctx, `UPDATE billing.top_ups SET lease_expires_at = now() - interval '1 second' WHERE lease_owner IS NOT NULL`)
	require.NoError(t, err)
	b.retrySnoozed(t, ctx, "top_up")
}

// requireBoughtOnce checks that top-up topUpID of customer id succeeded with
// one PaymentIntent on Stripe, for its amount, and bought one grant of it.
func (b *testBundle) requireBoughtOnce(t *testing.T, ctx context.Context, id, topUpID string, amount int64) {
	t.Helper()
	tu := b.waitTopUp(t, ctx, id, topUpID, topUpIs(ledger.TopUpSucceeded))
	pis := b.sim.PaymentIntentList()
	var mine int
	for _, pi := range pis {
		if pi.Metadata["tally_top_up_key"] == tu.Key {
			mine++
			require.Equal(t, amount, pi.Amount)
			require.Equal(t, *tu.StripePaymentIntentID, pi.ID)
		}
	}
	require.Equal(t, 1, mine, "one PaymentIntent carries the top-up's key")
	require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.credit_grants WHERE top_up_id = $1`, tu.ID))
	require.Equal(t, amount, b.Count(t, `SELECT sum(amount_cents) FROM billing.credit_grant_entries WHERE customer_id = $1
AND grant_id = $2`, id, ledger.TopUpGrantPrefix+topUpID), "the grant holds what was paid")
}

// A top-up is charged once and buys one grant, whatever line its run dies
// at and whatever Stripe answers.
func TestTopUp(t *testing.T) {
	t.Parallel()

	t.Run("Buys", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.Customer(t, "acme")
		b.topUp(t, ctx, "acme", "tu-1", 5000)
		b.requireBoughtOnce(t, ctx, "acme", "tu-1", 5000)
		credits, err := b.Ledger.CustomerCredits(ctx, ledger.CreditsParams{CustomerID: "acme"})
		require.NoError(t, err)
		require.Len(t, credits.Grants, 1)
		require.Equal(t, int64(5000), credits.Grants[0].RemainingCents)
		require.Equal(t, ledger.CreditPaid, credits.Grants[0].Category)
	})

	for _, point := range []string{jobs.CrashTopUpAfterClaim, jobs.CrashTopUpAfterStripe, jobs.CrashTopUpBeforeComplete} {
		t.Run("CrashAt_"+point, func(t *testing.T) {
			t.Parallel()
			ctx, b := setup(t, setupOpts{crashAt: point})
			b.Customer(t, "acme")
			b.topUp(t, ctx, "acme", "tu-1", 5000)
			b.waitCrashed(t)
			tu, err := b.Ledger.TopUpGet(ctx, "acme", "tu-1")
			require.NoError(t, err)
			require.NotEqual(t, ledger.TopUpSucceeded, tu.Status, "nothing after the crash point committed")
			require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.credit_grants`))
			b.rerunTopUps(t, ctx)
			b.requireBoughtOnce(t, ctx, "acme", "tu-1", 5000)
		})
	}

	t.Run("TimeoutAfterStripeSucceeded", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.Customer(t, "acme")
		b.fault(t, stripesim.Fault{Kind: stripesim.FaultKindDropAfterCreate, Customer: "cus_acme", Count: 1})
		b.topUp(t, ctx, "acme", "tu-1", 5000)
		b.requireBoughtOnce(t, ctx, "acme", "tu-1", 5000)
	})

	t.Run("ServerErrorAfterStripeSucceeded", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.Customer(t, "acme")
		b.fault(t, stripesim.Fault{Kind: stripesim.FaultKindError500AfterCreate, Customer: "cus_acme", Count: 1})
		b.topUp(t, ctx, "acme", "tu-1", 5000)
		b.requireBoughtOnce(t, ctx, "acme", "tu-1", 5000)
	})

	t.Run("RateLimited", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.Customer(t, "acme")
		b.fault(t, stripesim.Fault{Kind: stripesim.FaultKindRateLimit, Customer: "cus_acme", Count: 1})
		b.topUp(t, ctx, "acme", "tu-1", 5000)
		b.waitTopUp(t, ctx, "acme", "tu-1", func(tu *ledger.TopUp) bool { return tu.AttemptCount >= 1 && tu.LeaseOwner == nil })
		b.rerunTopUps(t, ctx)
		b.requireBoughtOnce(t, ctx, "acme", "tu-1", 5000)
	})

	// Stripe stores a 500 under the key and answers it to every retry:
	// the job gives up (unknown), and a redrive days later, past the key
	// window, looks on Stripe, finds nothing and calls with the next key
	// generation.
	t.Run("StoredErrorRedrivenPastTheKeyWindow", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.Customer(t, "acme")
		b.fault(t, stripesim.Fault{Kind: stripesim.FaultKindError500BeforeCreate, Customer: "cus_acme", Count: 1})
		b.topUp(t, ctx, "acme", "tu-1", 5000)
		_, err := b.Pool.Exec(ctx, `UPDATE river.river_job SET max_attempts = 3 WHERE kind = 'top_up'`)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			return b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'top_up' AND state = 'discarded'`) == 1
		}, waitTimeout, 50*time.Millisecond, "the job gives up on the stored 500")
		tu := b.waitTopUp(t, ctx, "acme", "tu-1", topUpIs(ledger.TopUpUnknown))
		require.Zero(t, tu.KeyGeneration)
		require.Empty(t, b.sim.PaymentIntentList())

		b.pastTallyKeyWindow()
		items, err := jobs.Redrive(ctx, b.River, jobs.RedriveParams{CustomerID: "acme", Kinds: []string{"top_up"}})
		require.NoError(t, err)
		require.Len(t, items, 1)
		b.requireBoughtOnce(t, ctx, "acme", "tu-1", 5000)
		tu = b.waitTopUp(t, ctx, "acme", "tu-1", topUpIs(ledger.TopUpSucceeded))
		require.Equal(t, 1, tu.KeyGeneration)
	})

	t.Run("DeclinedFailsWithoutGrant", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.Customer(t, "acme")
		b.fault(t, stripesim.Fault{Kind: stripesim.FaultKindDecline, Customer: "cus_acme", Count: 1})
		b.topUp(t, ctx, "acme", "tu-1", 5000)
		tu := b.waitTopUp(t, ctx, "acme", "tu-1", topUpIs(ledger.TopUpFailed))
		require.NotNil(t, tu.FailureCode)
		require.Equal(t, "card_declined", *tu.FailureCode)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.credit_grants`))
		require.Zero(t, b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'top_up' AND finalized_at IS NULL`),
			"the job completed with the failure")
	})

	t.Run("OverCustomerCapHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		maxCents := int64(1000)
		_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd",
			MaxChargeCents: &maxCents})
		require.NoError(t, err)
		b.topUp(t, ctx, "acme", "tu-1", 5000)
		tu := b.waitTopUp(t, ctx, "acme", "tu-1", topUpIs(ledger.TopUpHeld))
		require.Equal(t, ledger.HeldOverCustomerCap, *tu.HeldReason)
		require.Empty(t, b.sim.PaymentIntentList())
		canceled, changed, err := b.Ledger.TopUpCancel(ctx, ledger.TopUpCancelParams{CustomerID: "acme", TopUpID: "tu-1",
			Reason: "over the cap; bought a smaller one", Actor: "operator:test"})
		require.NoError(t, err)
		require.True(t, changed)
		require.Equal(t, ledger.TopUpCanceled, canceled.Status)
	})

	t.Run("WebhooksAndReplaysGrantOnce", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{webhooks: true})
		b.Customer(t, "acme")
		b.topUp(t, ctx, "acme", "tu-1", 5000)
		b.requireBoughtOnce(t, ctx, "acme", "tu-1", 5000)
		b.waitSimEventsDone(t, ctx)
		for _, ev := range b.sim.EventList() {
			require.NoError(t, b.sim.EventResend(ev.ID))
		}
		b.waitSimEventsDone(t, ctx)
		require.Positive(t, b.Count(t, `SELECT count(*) FROM billing.stripe_events WHERE type = 'payment_intent.succeeded'
AND status = 'processed'`), "the webhook was applied to the top-up, not ignored")
		b.requireBoughtOnce(t, ctx, "acme", "tu-1", 5000)
	})
}

// One automatic recharge per crossing of the threshold, however many times
// the close that crosses it runs.
func TestAutomaticRecharge(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{ledger: ledger.Config{WebhooksAllow: webhook.LoopbackNetworks()}})
	r := b.endpoint(t, ctx, 0, ledger.NotifyCreditBalanceLow, ledger.NotifyTopUpSucceeded, ledger.NotifyTopUpFailed)
	b.customerWithEvents(t, ctx, "acme", 100, 150)
	below, to := int64(500), int64(2000)
	_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd",
		RechargeBelowCents: &below, RechargeToCents: &to})
	require.NoError(t, err)
	b.grant(t, ctx, "acme", 600)
	b.runChargeJobNow(t, ctx, "acme")
	b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeCovered))
	b.closeNow(t, ctx, "acme") // a second close finds the charge: no second recharge
	tu := b.waitTopUp(t, ctx, "acme", "recharge-1", topUpIs(ledger.TopUpSucceeded))
	require.Equal(t, ledger.TopUpSourceRecharge, tu.Source)
	require.Equal(t, int64(1650), tu.AmountCents, "what brings the balance of 350 to 2000")
	b.requireBoughtOnce(t, ctx, "acme", "recharge-1", 1650)
	require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.top_ups`), "one top-up for the crossing")
	require.Equal(t, int64(2000), b.Count(t, `SELECT sum(amount_cents) FROM billing.credit_grant_entries`))
	var armed bool
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT recharge_armed FROM billing.customers WHERE customer_id = 'acme'`).Scan(&armed))
	require.True(t, armed, "the recharge's grant armed it again")

	require.Eventually(t, func() bool { return len(r.delivered()) == 2 }, waitTimeout, 20*time.Millisecond)
	got := map[string]ledger.NotificationBody{}
	for _, n := range r.delivered() {
		got[n.Type] = n
	}
	var low ledger.BalanceLow
	require.NoError(t, json.Unmarshal(got[ledger.NotifyCreditBalanceLow].Data.Object, &low))
	require.Equal(t, int64(350), low.BalanceCents, "the balance the close left")
	require.Equal(t, "recharge-1", low.TopUp.TopUpID)
	var bought ledger.PublicTopUp
	require.NoError(t, json.Unmarshal(got[ledger.NotifyTopUpSucceeded].Data.Object, &bought))
	require.Equal(t, "succeeded", bought.Status)
	require.Equal(t, "top_up:recharge-1", *bought.GrantID)
}

// A declined top-up sends top_up.failed and buys nothing; the recharge it
// was stays disarmed, so the next close does not charge the card again.
func TestAutomaticRechargeDeclined(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{ledger: ledger.Config{WebhooksAllow: webhook.LoopbackNetworks()}})
	r := b.endpoint(t, ctx, 0, ledger.NotifyTopUpFailed)
	b.customerWithEvents(t, ctx, "acme", 30) // below Stripe's minimum: the recharge is the only call
	below, to := int64(500), int64(2000)
	_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd",
		RechargeBelowCents: &below, RechargeToCents: &to})
	require.NoError(t, err)
	b.fault(t, stripesim.Fault{Kind: stripesim.FaultKindDecline, Customer: "cus_acme", Count: 1})
	b.runChargeJobNow(t, ctx, "acme")
	b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeCarriedForward))
	tu := b.waitTopUp(t, ctx, "acme", "recharge-1", topUpIs(ledger.TopUpFailed))
	require.Equal(t, int64(2000), tu.AmountCents, "from a balance of nothing")
	require.Eventually(t, func() bool { return len(r.delivered()) == 1 }, waitTimeout, 20*time.Millisecond)
	require.Equal(t, ledger.NotifyTopUpFailed, r.delivered()[0].Type)
	require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.credit_grants`))
	var armed bool
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT recharge_armed FROM billing.customers WHERE customer_id = 'acme'`).Scan(&armed))
	require.False(t, armed, "a failed recharge is not retried until the balance is back")
}

// The usage roll-up starts the recharge as soon as the open period's rated
// usage projects the balance below the threshold, before any close.
func TestAutomaticRechargeProjected(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{rollupInterval: 200 * time.Millisecond})
	// A period that closes after the wall clock's now, so its charge job
	// (scheduled at its close, on River's clock) waits.
	b.Clock.Advance(time.Until(b.Clock.Now()) + 40*24*time.Hour)
	below, to := int64(500), int64(2000)
	_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd",
		RechargeBelowCents: &below, RechargeToCents: &to})
	require.NoError(t, err)
	b.grant(t, ctx, "acme", 600)
	for i, amount := range []int64{100, 150} {
		_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: fmt.Sprint("e", i), AmountCents: amount})
		require.NoError(t, err)
	}
	tu := b.waitTopUp(t, ctx, "acme", "recharge-1", topUpIs(ledger.TopUpSucceeded))
	require.Equal(t, int64(1650), tu.AmountCents, "what brings the projected balance of 600 - 250 to 2000 (600 - 100 is not below)")
	require.Equal(t, "usage_rollup", tu.CreatedBy)
	// Roll-ups after the grant landed project 2250 - 250: no second recharge.
	rollups := b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'usage_rollup'`)
	require.Eventually(t, func() bool {
		return b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'usage_rollup'`) >= rollups+3
	}, waitTimeout, 50*time.Millisecond)
	require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.top_ups`))
	require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.periods WHERE status = 'open'`))
}
