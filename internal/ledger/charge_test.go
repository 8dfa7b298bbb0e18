package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

func TestChargeKeys(t *testing.T) {
	t.Parallel()
	// Values from: echo -n "tally:charge:v1:acme:2026-11" | sha256sum (and ":0").
	require.Equal(t, "e9573a96c8fa854f5b7930a9726988265eb17390b5cc8a91ae09162b0b3e0805", ledger.ChargeKey("", "acme", "2026-11"), "v1")
	require.Equal(t, "7e069e69beb29af601010f586b537ade06b5095a8b659089adbc4d20da76e443", ledger.ChargeIdempotencyKey("", "acme", "2026-11", 0), "v1")
	// echo -n "tally:charge:v2:default:acme:2026-11" | sha256sum (and ":0").
	require.Equal(t, "c54250aec7c8802ffb2b4d388552208f89f187f01c502419fbf25d7a9e504caf", ledger.ChargeKey("default", "acme", "2026-11"))
	require.Equal(t, "ffb3eefae49f876b29fce0e600471a332bf238f861909e3f2f1c00b53c219bb3", ledger.ChargeIdempotencyKey("default", "acme", "2026-11", 0))
	require.NotEqual(t, ledger.ChargeKey("default", "acme", "2026-11"), ledger.ChargeKey("staging", "acme", "2026-11"))
	require.NotEqual(t, ledger.ChargeIdempotencyKey("default", "acme", "2026-11", 0), ledger.ChargeIdempotencyKey("default", "acme", "2026-11", 1))
}

func (b *testBundle) close(t *testing.T, ctx context.Context) *ledger.Charge {
	t.Helper()
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "test"})
	require.NoError(t, err)
	return c
}

// closedCharge sets up acme's November with one event, closed.
func closedCharge(t *testing.T) (context.Context, *testBundle, *ledger.Charge) {
	t.Helper()
	ctx, b := setup(t, setupOpts{})
	_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
	require.NoError(t, err)
	return ctx, b, b.close(t, ctx)
}

func TestPeriodClose(t *testing.T) {
	t.Parallel()

	t.Run("CapHoldsCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		limit := int64(150)
		_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd", MaxChargeCents: &limit})
		require.NoError(t, err)
		_, err = b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{event("e1", 100), event("e2", 100)})
		require.NoError(t, err)
		c := b.close(t, ctx)
		require.Equal(t, ledger.ChargePending, c.Status, "the guards run when the charge is first claimed")
		claim, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
		require.NoError(t, err)
		require.Nil(t, claim, "held: nothing to call")
		c, err = b.Ledger.ChargeGet(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeHeld, c.Status)
		require.Equal(t, ledger.HeldOverCustomerCap, *c.HeldReason)
		require.Contains(t, *c.HeldDetail, "max_charge_cents 150")
		require.Nil(t, c.LeaseOwner)
		require.False(t, c.BudgetReserved)
	})

	t.Run("EventsRacingTheCloseAreChargedOrRejected", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("first", 1))
		require.NoError(t, err)

		var (
			acked    sync.Map // event_id → amount
			closed   atomic.Bool
			rejected atomic.Int64
			wg       sync.WaitGroup
		)
		acked.Store("first", int64(1))
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					id := fmt.Sprintf("w%d-%d", w, i)
					amount := int64(w*1000 + i + 1)
					_, err := b.Ledger.UsageEventRecord(ctx, event(id, amount))
					var ce *ledger.ConflictError
					switch {
					case err == nil:
						acked.Store(id, amount)
					case errors.As(err, &ce) && ce.Code == ledger.ConflictPeriodClosed:
						rejected.Add(1)
						return
					default:
						t.Errorf("unexpected error: %v", err)
						return
					}
					if closed.Load() && i > 1000 {
						return
					}
				}
			}()
		}
		// Let the writers run, then close in the middle of their stream.
		time.Sleep(200 * time.Millisecond)
		c := b.close(t, ctx)
		closed.Store(true)
		wg.Wait()

		var count, total int64
		acked.Range(func(_, v any) bool {
			count++
			total += v.(int64)
			return true
		})
		require.Equal(t, total, c.AmountCents, "every acknowledged event is in the charge")
		require.Equal(t, count, c.EventCount)
		require.Equal(t, count, b.eventCount(t), "no event is stored without an acknowledgement")
		require.Equal(t, int64(8), rejected.Load(), "every writer met period_closed")
	})

	t.Run("ExistingChargeIsReturnedUnchanged", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		first := b.close(t, ctx)
		again := b.close(t, ctx)
		require.Equal(t, first, again)
		require.Equal(t, int64(1), b.Count(t, "SELECT count(*) FROM billing.charges"))
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-10", Actor: "test"})
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})

	t.Run("SnapshotsParameters", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, err := b.Ledger.UsageEventRecordBatch(ctx, []ledger.UsageEventParams{event("e1", 100), event("e2", 23)})
		require.NoError(t, err)
		c := b.close(t, ctx)
		require.Equal(t, ledger.ChargePending, c.Status)
		require.Equal(t, int64(123), c.AmountCents)
		require.Equal(t, int64(2), c.EventCount)
		require.Equal(t, "cus_acme", c.StripeCustomerID)
		require.Nil(t, c.StripePaymentMethodID)
		require.Equal(t, ledger.ChargeKey("default", "acme", "2026-11"), c.ChargeKey)
		require.Equal(t, ledger.ChargeIdempotencyKey("default", "acme", "2026-11", 0), c.IdempotencyKey)

		// A later customer change does not reach the charge.
		pm := "pm_new"
		_, _, err = b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_other", Currency: "usd", StripePaymentMethodID: &pm})
		require.NoError(t, err)
		require.Equal(t, c, b.close(t, ctx))
	})
}

// expireLeases ends every lease now, as time passing would: leases live on
// Postgres's clock, not the ledger's test clock.
func expireLeases(t *testing.T, b *testBundle) {
	t.Helper()
	_, err := b.Pool.Exec(context.Background(), `
UPDATE billing.charges SET lease_expires_at = now() - interval '1 second' WHERE lease_owner IS NOT NULL`)
	require.NoError(t, err)
}

func TestChargeClaim(t *testing.T) {
	t.Parallel()

	claimParams := func(id int64, owner string) ledger.ChargeClaimParams {
		return ledger.ChargeClaimParams{ChargeID: id, Owner: owner, LeaseTTL: time.Minute}
	}

	t.Run("AttemptLogIsAppendOnly", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		claim := b.claimToCall(t, ctx, claimParams(c.ID, "a"))
		_, err := b.Ledger.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeUnknown}, "job:1/1", nil)
		require.NoError(t, err)
		for _, stmt := range []string{
			"UPDATE billing.charge_attempts SET outcome = 'succeeded'",
			"DELETE FROM billing.charge_attempts",
			"UPDATE billing.charge_transitions SET actor = 'x'",
		} {
			_, err := b.Pool.Exec(ctx, stmt)
			require.ErrorContains(t, err, "append-only", stmt)
		}
	})

	t.Run("LeaseHeldThenExpires", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)

		claim := b.claimToCall(t, ctx, claimParams(c.ID, "a"))
		require.Equal(t, 1, claim.Charge.AttemptCount)
		require.Equal(t, b.Clock.Now(), *claim.Charge.FirstAttemptedAt)

		_, err := b.Ledger.ChargeClaim(ctx, claimParams(c.ID, "b"))
		var held *ledger.LeaseHeldError
		require.ErrorAs(t, err, &held)
		require.Equal(t, "a", held.Owner)

		expireLeases(t, b)
		claim, err = b.Ledger.ChargeClaim(ctx, claimParams(c.ID, "b"))
		require.NoError(t, err)
		require.False(t, claim.Lookup, "an attempt of the generation is on record, within the key window")
		require.NotZero(t, claim.AttemptID)
		require.Equal(t, 2, claim.Charge.AttemptCount)
		require.Equal(t, ledgertest.ClockStart, *claim.Charge.FirstAttemptedAt, "set once")
		require.Equal(t, int64(2), b.Count(t, "SELECT count(*) FROM billing.charge_attempts"))
	})

	t.Run("LostLeaseCannotRecord", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		stale, err := b.Ledger.ChargeClaim(ctx, claimParams(c.ID, "a"))
		require.NoError(t, err)
		expireLeases(t, b)
		fresh, err := b.Ledger.ChargeClaim(ctx, claimParams(c.ID, "b"))
		require.NoError(t, err)

		_, err = b.Ledger.ChargeRecordOutcome(ctx, stale, ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_1"}, "job:1/1", nil)
		require.ErrorIs(t, err, ledger.ErrLeaseLost)
		got, err := b.Ledger.ChargeRecordOutcome(ctx, fresh, ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_1"}, "job:2/1", nil)
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeSucceeded, got.Status)
		require.Nil(t, got.LeaseOwner)
	})

	t.Run("NothingToClaimWhenSettled", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		claim, err := b.Ledger.ChargeClaim(ctx, claimParams(c.ID, "a"))
		require.NoError(t, err)
		_, err = b.Ledger.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeFailed, ErrorCode: "card_declined"}, "job:1/1", nil)
		require.NoError(t, err)
		claim, err = b.Ledger.ChargeClaim(ctx, claimParams(c.ID, "b"))
		require.NoError(t, err)
		require.Nil(t, claim)
	})

	t.Run("SkewedClockNeverTakesALiveLease", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		claim, err := b.Ledger.ChargeClaim(ctx, claimParams(c.ID, "a"))
		require.NoError(t, err)
		require.NotNil(t, claim)

		// A replica whose clock runs ten minutes ahead, on the same database.
		skewed, err := ledger.New(b.Pool, ledger.Config{Scheduler: jobs.Scheduler{Client: b.River},
			Clock: func() time.Time { return b.Clock.Now().Add(10 * time.Minute) }})
		require.NoError(t, err)
		skewed2, err := ledger.New(b.Pool, ledger.Config{Scheduler: jobs.Scheduler{Client: b.River},
			Clock: func() time.Time { return time.Now().Add(10 * time.Minute) }})
		require.NoError(t, err)
		for _, l := range []*ledger.Ledger{skewed, skewed2} {
			_, err = l.ChargeClaim(ctx, claimParams(c.ID, "b"))
			var held *ledger.LeaseHeldError
			require.ErrorAs(t, err, &held, "the lease lives on Postgres's clock")
			require.Equal(t, "a", held.Owner)
			require.Greater(t, held.Left, 50*time.Second)
		}
	})

	t.Run("SnapshotsPaymentMethodOnce", func(t *testing.T) {
		t.Parallel()
		withPaymentMethod := func(id int64, owner, pm string) ledger.ChargeClaimParams {
			p := claimParams(id, owner)
			p.PaymentMethodID = pm
			return p
		}

		// The first claim snapshots the payment method its caller looked up;
		// a later claim, once the charge was attempted, never changes it.
		ctx, b, c := closedCharge(t)
		require.Nil(t, c.StripePaymentMethodID)
		claim, err := b.Ledger.ChargeClaim(ctx, withPaymentMethod(c.ID, "a", "pm_first"))
		require.NoError(t, err)
		require.Equal(t, "pm_first", *claim.Charge.StripePaymentMethodID)
		require.NoError(t, b.Ledger.ChargeRelease(ctx, claim))
		claim, err = b.Ledger.ChargeClaim(ctx, withPaymentMethod(c.ID, "b", "pm_second"))
		require.NoError(t, err)
		require.Equal(t, "pm_first", *claim.Charge.StripePaymentMethodID)

		// A charge whose key generation was attempted without one keeps
		// none: every attempt of a key sends the same parameters.
		ctx, b, c = closedCharge(t)
		claim, err = b.Ledger.ChargeClaim(ctx, claimParams(c.ID, "a"))
		require.NoError(t, err)
		require.True(t, claim.Lookup)
		claim, err = b.Ledger.ChargeLookupNone(ctx, claim, "job:1/1") // the attempt of generation 0
		require.NoError(t, err)
		require.NoError(t, b.Ledger.ChargeRelease(ctx, claim))
		claim, err = b.Ledger.ChargeClaim(ctx, withPaymentMethod(c.ID, "b", "pm_late"))
		require.NoError(t, err)
		require.Nil(t, claim.Charge.StripePaymentMethodID)

		// Claimed without one but never attempted (released before its
		// look-up): its key was never sent, so the next claim's is taken.
		ctx, b, c = closedCharge(t)
		claim, err = b.Ledger.ChargeClaim(ctx, claimParams(c.ID, "a"))
		require.NoError(t, err)
		require.NoError(t, b.Ledger.ChargeRelease(ctx, claim))
		claim, err = b.Ledger.ChargeClaim(ctx, withPaymentMethod(c.ID, "b", "pm_late"))
		require.NoError(t, err)
		require.Equal(t, "pm_late", *claim.Charge.StripePaymentMethodID)
	})
}

func TestChargeReconcile(t *testing.T) {
	t.Parallel()

	resolve := func(t *testing.T, ctx context.Context, b *testBundle, class ledger.OutcomeClass, pi string) (*ledger.Charge, bool, *ledger.DoubleCharge, error) {
		t.Helper()
		a, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{
			ChargeKey: ledger.ChargeKey("default", "acme", "2026-11"), Actor: "webhook:test",
			Outcome: ledger.Outcome{Class: class, StripePaymentIntentID: pi, ErrorCode: "x"},
		})
		return a.Charge, a.Changed, a.DoubleCharge, err
	}

	t.Run("FailedThenPaidOnTheSamePaymentIntent", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := closedCharge(t)
		c, _, _, err := resolve(t, ctx, b, ledger.OutcomeFailed, "pi_A")
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeFailed, c.Status)
		// The customer authenticates on-session later: the money moved.
		c, changed, _, err := resolve(t, ctx, b, ledger.OutcomeSucceeded, "pi_A")
		require.NoError(t, err)
		require.True(t, changed)
		require.Equal(t, ledger.ChargeSucceeded, c.Status)
	})

	t.Run("LateNewsNeverMovesBackwards", func(t *testing.T) {
		t.Parallel()
		ctx, b, _ := closedCharge(t)
		_, _, _, err := resolve(t, ctx, b, ledger.OutcomeSucceeded, "pi_A")
		require.NoError(t, err)
		for _, class := range []ledger.OutcomeClass{ledger.OutcomeProcessing, ledger.OutcomeFailed, ledger.OutcomeSucceeded} {
			c, changed, _, err := resolve(t, ctx, b, class, "pi_A")
			require.NoError(t, err)
			require.False(t, changed, class)
			require.Equal(t, ledger.ChargeSucceeded, c.Status)
		}
	})

	t.Run("SecondPaymentIntentHoldsAndNeverOverwrites", func(t *testing.T) {
		t.Parallel()
		ctx, b, charge := closedCharge(t)
		_, _, _, err := resolve(t, ctx, b, ledger.OutcomeProcessing, "pi_A")
		require.NoError(t, err)
		// A failure of another PaymentIntent with the same key changes nothing.
		c, changed, double, err := resolve(t, ctx, b, ledger.OutcomeFailed, "pi_B")
		require.NoError(t, err)
		require.NotNil(t, double)
		require.False(t, changed)
		require.Equal(t, ledger.ChargeProcessing, c.Status)
		require.Equal(t, "pi_A", *c.StripePaymentIntentID)
		// Its success is a double charge: held for a human.
		c, changed, double, err = resolve(t, ctx, b, ledger.OutcomeSucceeded, "pi_B")
		require.NoError(t, err)
		require.Equal(t, []string{"pi_A", "pi_B"}, double.PaymentIntents)
		require.True(t, changed)
		require.Equal(t, ledger.ChargeHeld, c.Status)
		require.Contains(t, *c.HeldReason, "double_charge")
		require.Equal(t, "pi_A", *c.StripePaymentIntentID)
		// And the hold stays, whatever the first PaymentIntent does.
		c, _, _, err = resolve(t, ctx, b, ledger.OutcomeSucceeded, "pi_A")
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeHeld, c.Status)
		require.Equal(t, int64(2), b.Count(t, `SELECT count(*) FROM billing.charge_transitions WHERE charge_id = $1 AND reason LIKE '%ALERT%'`, charge.ID))
	})

	t.Run("SecondPaymentIntentOnSettledChargeIsAlerted", func(t *testing.T) {
		t.Parallel()
		ctx, b, charge := closedCharge(t)
		b.subscribe(t, ctx, ledger.NotifyChargeSucceeded)
		_, _, _, err := resolve(t, ctx, b, ledger.OutcomeSucceeded, "pi_A")
		require.NoError(t, err)
		c, changed, double, err := resolve(t, ctx, b, ledger.OutcomeSucceeded, "pi_B")
		require.NoError(t, err)
		require.NotNil(t, double)
		require.False(t, changed)
		require.Equal(t, ledger.ChargeSucceeded, c.Status)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.charge_transitions WHERE charge_id = $1 AND reason LIKE 'ALERT%pi_B%'`, charge.ID))
		// The alert is a note on the same status, not a second success.
		require.Equal(t, []string{ledger.NotifyChargeSucceeded}, b.notifications(t, ctx))
	})

	t.Run("UnknownCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		_, _, _, err := resolve(t, ctx, b, ledger.OutcomeSucceeded, "pi_X")
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

// claimToCall claims a charge as a worker about to call Stripe does: when the
// claim needs a look-up, as if the look-up found no PaymentIntent.
func (b *testBundle) claimToCall(t *testing.T, ctx context.Context, p ledger.ChargeClaimParams) *ledger.Claim {
	t.Helper()
	claim, err := b.Ledger.ChargeClaim(ctx, p)
	require.NoError(t, err)
	if claim.Lookup {
		claim, err = b.Ledger.ChargeLookupNone(ctx, claim, "job:1/1")
		require.NoError(t, err)
	}
	return claim
}

func TestChargeLookup(t *testing.T) {
	t.Parallel()

	params := func(c *ledger.Charge, owner string) ledger.ChargeClaimParams {
		return ledger.ChargeClaimParams{ChargeID: c.ID, Owner: owner, LeaseTTL: time.Minute}
	}

	t.Run("FirstCallOfGenerationLooksUpFirst", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		require.Equal(t, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), c.PeriodStartsAt.UTC())

		claim, err := b.Ledger.ChargeClaim(ctx, params(c, "a"))
		require.NoError(t, err)
		require.True(t, claim.Lookup, "this database holds no attempt of generation 0")
		require.False(t, claim.KeyExpired)
		require.Zero(t, claim.AttemptID, "no attempt before the look-up")
		require.Nil(t, claim.Charge.GenerationFirstAttemptedAt)
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.charge_attempts`))

		next, err := b.Ledger.ChargeLookupNone(ctx, claim, "job:1/1")
		require.NoError(t, err)
		require.Equal(t, 0, next.Charge.KeyGeneration)
		require.Equal(t, c.IdempotencyKey, next.Charge.IdempotencyKey)
		require.NotZero(t, next.AttemptID)
		require.Equal(t, b.Clock.Now(), *next.Charge.GenerationFirstAttemptedAt, "the key's first use")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.charge_attempts`))

		// The retry after an unknown outcome reuses the key without a look-up.
		_, err = b.Ledger.ChargeRecordOutcome(ctx, next, ledger.Outcome{Class: ledger.OutcomeUnknown}, "job:1/1", nil)
		require.NoError(t, err)
		claim, err = b.Ledger.ChargeClaim(ctx, params(c, "b"))
		require.NoError(t, err)
		require.False(t, claim.Lookup)
		require.NotZero(t, claim.AttemptID)
	})

	t.Run("KeyWindowPassedMovesToNextGeneration", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		claim := b.claimToCall(t, ctx, params(c, "a"))
		_, err := b.Ledger.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeUnknown}, "job:1/1", nil)
		require.NoError(t, err)

		// A day later the key window has passed: the claim must look first.
		b.Clock.Advance(24 * time.Hour)
		claim, err = b.Ledger.ChargeClaim(ctx, params(c, "a"))
		require.NoError(t, err)
		require.True(t, claim.Lookup)
		require.True(t, claim.KeyExpired)
		require.Zero(t, claim.AttemptID, "no attempt before the look-up")

		next, err := b.Ledger.ChargeLookupNone(ctx, claim, "job:1/1")
		require.NoError(t, err)
		require.Equal(t, 1, next.Charge.KeyGeneration)
		require.Equal(t, ledger.ChargeIdempotencyKey("default", "acme", "2026-11", 1), next.Charge.IdempotencyKey)
		require.Equal(t, ledger.ChargePending, next.Charge.Status, "unknown → pending with the next key")
		require.NotZero(t, next.AttemptID)
		require.Equal(t, b.Clock.Now(), *next.Charge.GenerationFirstAttemptedAt, "a fresh window")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.charge_transitions WHERE charge_id = $1 AND reason LIKE 'key generation 1:%'`, c.ID))
	})

	t.Run("LostLeaseCannotProceed", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		stale, err := b.Ledger.ChargeClaim(ctx, params(c, "a"))
		require.NoError(t, err)
		expireLeases(t, b)
		fresh := b.claimToCall(t, ctx, params(c, "b"))
		require.NotZero(t, fresh.AttemptID)

		_, err = b.Ledger.ChargeLookupNone(ctx, stale, "job:1/1")
		require.ErrorIs(t, err, ledger.ErrLeaseLost)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.charge_attempts`))
	})

	t.Run("MarkLeavesSettledChargesAlone", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		claim := b.claimToCall(t, ctx, params(c, "a"))
		_, err := b.Ledger.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_1"}, "job:1/1", nil)
		require.NoError(t, err)
		marked, err := b.Ledger.ChargeLookupMark(ctx, "operator:test", "restore")
		require.NoError(t, err)
		require.Empty(t, marked)
	})

	t.Run("MarkMakesTheNextCallLookUp", func(t *testing.T) {
		t.Parallel()
		ctx, b, c := closedCharge(t)
		claim := b.claimToCall(t, ctx, params(c, "a"))
		_, err := b.Ledger.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeUnknown}, "job:1/1", nil)
		require.NoError(t, err)

		// After a restore, an operator marks every charge that may still call.
		marked, err := b.Ledger.ChargeLookupMark(ctx, "operator:test", "restored from last night's backup")
		require.NoError(t, err)
		require.Len(t, marked, 1)
		require.True(t, marked[0].LookupRequired)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.charge_transitions
WHERE charge_id = $1 AND from_status = 'unknown' AND to_status = 'unknown' AND actor = 'operator:test'
  AND reason LIKE 'marked for a look-up%restored from last night''s backup'`, c.ID))

		claim, err = b.Ledger.ChargeClaim(ctx, params(c, "a"))
		require.NoError(t, err)
		require.True(t, claim.Lookup, "an attempt is on record, but the record may be incomplete")
		require.False(t, claim.KeyExpired)
		next, err := b.Ledger.ChargeLookupNone(ctx, claim, "job:1/1")
		require.NoError(t, err)
		require.False(t, next.Charge.LookupRequired)
		require.Equal(t, 0, next.Charge.KeyGeneration, "within the window the key stays")
		require.Equal(t, *claim.Charge.GenerationFirstAttemptedAt, *next.Charge.GenerationFirstAttemptedAt, "the key's first use stays")
	})
}

func TestChargeListStale(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	for _, c := range []string{"a", "p", "u"} {
		b.Customer(t, c)
		ev := event("e1", 100)
		ev.CustomerID = c
		_, err := b.Ledger.UsageEventRecord(ctx, ev)
		require.NoError(t, err)
		_, err = b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: c, Period: "2026-11", Actor: "test"})
		require.NoError(t, err)
	}
	// p is processing, u unknown, a pending and never attempted.
	for c, o := range map[string]ledger.Outcome{
		"p": {Class: ledger.OutcomeProcessing, StripePaymentIntentID: "pi_p"},
		"u": {Class: ledger.OutcomeUnknown},
	} {
		charge, err := b.Ledger.ChargeGetByPeriod(ctx, c, "2026-11")
		require.NoError(t, err)
		claim, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: charge.ID, Owner: "w", LeaseTTL: time.Minute})
		require.NoError(t, err)
		_, err = b.Ledger.ChargeRecordOutcome(ctx, claim, o, "job:3/1", nil)
		require.NoError(t, err)
	}
	customers := func(charges []*ledger.Charge) []string {
		var ids []string
		for _, c := range charges {
			ids = append(ids, c.CustomerID)
		}
		return ids
	}

	require.Empty(t, must(b.Ledger.ChargeListStale(ctx, b.Clock.Now().Add(-10*time.Minute), 10)), "nothing is quiet yet")
	b.Clock.Advance(time.Hour)
	before := b.Clock.Now().Add(-10 * time.Minute)
	stale := must(b.Ledger.ChargeListStale(ctx, before, 10))
	require.Len(t, stale, 3)
	require.Equal(t, "p", stale[2].CustomerID, "processing charges come last")

	// A charge just reconciled waits its turn; the others come first.
	require.NoError(t, b.Ledger.ChargeMarkReconciled(ctx, stale[0].ID))
	require.NotContains(t, customers(must(b.Ledger.ChargeListStale(ctx, before, 10))), stale[0].CustomerID)
	b.Clock.Advance(time.Hour)
	again := must(b.Ledger.ChargeListStale(ctx, b.Clock.Now().Add(-10*time.Minute), 10))
	require.Len(t, again, 3)
	require.Equal(t, stale[0].CustomerID, again[1].CustomerID, "the least recently reconciled first")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
