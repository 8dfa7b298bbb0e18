package ledger_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// grant gives acme amount usd of promotional credits as grant id, with the
// default priority unless changed by opts.
func (b *testBundle) grant(ctx context.Context, t *testing.T, id string, amount int64, opts ...func(*ledger.CreditGrantParams)) *ledger.CreditGrant {
	t.Helper()
	p := ledger.CreditGrantParams{CustomerID: "acme", GrantID: id, AmountCents: amount, Currency: "usd",
		Category: ledger.CreditPromotional, Actor: "operator:test"}
	for _, o := range opts {
		o(&p)
	}
	g, created, err := b.Ledger.CreditGrantCreate(ctx, p)
	require.NoError(t, err, id)
	require.True(t, created, id)
	return g
}

func priority(n int32) func(*ledger.CreditGrantParams) {
	return func(p *ledger.CreditGrantParams) { p.Priority = &n }
}

func expiresAt(at time.Time) func(*ledger.CreditGrantParams) {
	return func(p *ledger.CreditGrantParams) { p.ExpiresAt = &at }
}

// remaining is what is left of acme's grant id: the sum of its entries.
func (b *testBundle) remaining(t *testing.T, id string) int64 {
	t.Helper()
	return b.Count(t, `SELECT coalesce(sum(amount_cents), 0) FROM billing.credit_grant_entries
WHERE customer_id = 'acme' AND grant_id = $1`, id)
}

// requireCredits requires charge c's credit lines to be, in order, the
// grants and amounts (positive) of want, and each to match the grant's
// applied entry for c.
func requireCredits(t *testing.T, ctx context.Context, b *testBundle, c *ledger.Charge, want ...any) {
	t.Helper()
	lines, err := b.Ledger.ChargeLines(ctx, c.ID)
	require.NoError(t, err)
	var got []any
	var sum int64
	for _, l := range lines {
		sum += l.AmountCents
		if l.Kind != ledger.ChargeLineCredit {
			require.Empty(t, l.GrantID)
			continue
		}
		got = append(got, l.GrantID, -l.AmountCents)
		require.Equal(t, l.AmountCents, b.Count(t, `SELECT amount_cents FROM billing.credit_grant_entries
WHERE kind = 'applied' AND charge_id = $1 AND grant_id = $2`, c.ID, l.GrantID), "the line is the entry")
	}
	require.Equal(t, want, got)
	require.Equal(t, c.AmountCents, sum, "a charge is the sum of its lines, credits included")
	require.Equal(t, int64(len(want)/2), b.Count(t, `SELECT count(*) FROM billing.credit_grant_entries WHERE charge_id = $1`, c.ID))
	require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.reconciliation WHERE charge_id = $1`, c.ID))
}

// The close applies credits to the lines they cover, in a fixed order, and
// the charge is what remains.
func TestCreditBurnDown(t *testing.T) {
	t.Parallel()

	t.Run("PartOfTheCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.grant(ctx, t, "welcome", 300)
		b.record(ctx, t, event("p", 1000))
		c := b.closeNov(ctx, t)
		require.Equal(t, ledger.ChargePending, c.Status)
		require.Equal(t, int64(700), c.AmountCents)
		requireCredits(t, ctx, b, c, "welcome", int64(300))
		require.Zero(t, b.remaining(t, "welcome"))
	})

	t.Run("PriorityThenExpiryThenAge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.grant(ctx, t, "a-old", 100)
		b.Clock.Advance(time.Second)
		b.grant(ctx, t, "b-first", 200, priority(10))
		b.grant(ctx, t, "c-expiring", 300, expiresAt(time.Date(2026, 12, 20, 0, 0, 0, 0, time.UTC)))
		b.grant(ctx, t, "d-new", 1000)
		b.grant(ctx, t, "e-last", 1000, priority(90))
		b.record(ctx, t, event("p", 1000))
		c := b.closeNov(ctx, t)
		require.Equal(t, int64(0), c.AmountCents)
		require.Equal(t, ledger.ChargeCovered, c.Status, "credits paid it whole: no Stripe call")
		requireCredits(t, ctx, b, c, "b-first", int64(200), "c-expiring", int64(300), "a-old", int64(100), "d-new", int64(400))
		require.Equal(t, int64(600), b.remaining(t, "d-new"))
		require.Equal(t, int64(1000), b.remaining(t, "e-last"))
		require.Equal(t, int64(0), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_period' AND state = 'available'`)+
			b.Count(t, `SELECT count(*) FROM billing.charge_attempts`), "nothing to call Stripe for")

		again := b.closeNov(ctx, t)
		require.Equal(t, c.ID, again.ID)
		requireCredits(t, ctx, b, again, "b-first", int64(200), "c-expiring", int64(300), "a-old", int64(100), "d-new", int64(400))
		require.Equal(t, int64(600), b.remaining(t, "d-new"), "a close run again applies nothing again")
	})

	t.Run("ScopedToMetrics", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onStd(ctx, t) // api_calls at 0.5
		b.grant(ctx, t, "calls-only", 10_000, func(p *ledger.CreditGrantParams) { p.Metrics = []string{"api_calls"} })
		b.grant(ctx, t, "storage-only", 10_000, func(p *ledger.CreditGrantParams) { p.Metrics = []string{"storage_gb"} })
		b.record(ctx, t, quantityEvent("q", "api_calls", "40"), event("p", 500))
		c := b.closeNov(ctx, t)
		require.Equal(t, int64(500), c.AmountCents, "the usage line (20) is covered, not the pre-priced one")
		requireCredits(t, ctx, b, c, "calls-only", int64(20))
		require.Equal(t, int64(10_000), b.remaining(t, "storage-only"))
	})

	t.Run("ValidWhenThePeriodEnded", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.grant(ctx, t, "expired-in-nov", 100, expiresAt(time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)))
		b.grant(ctx, t, "expires-dec-1", 200, expiresAt(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)))
		b.grant(ctx, t, "expires-dec-2", 300, expiresAt(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)))
		b.grant(ctx, t, "euros", 400, func(p *ledger.CreditGrantParams) { p.Currency = "eur" })
		b.record(ctx, t, event("p", 1000))
		b.Clock.Set(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC))
		b.grant(ctx, t, "after-the-end", 500)
		c := b.closeNov(ctx, t)
		require.Equal(t, int64(700), c.AmountCents)
		requireCredits(t, ctx, b, c, "expires-dec-2", int64(300))
	})

	t.Run("ClosedEarlyAtItsClose", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.record(ctx, t, event("p", 1000))
		b.grant(ctx, t, "now", 100)
		b.grant(ctx, t, "expires-before-the-end", 100, expiresAt(ledgertest.ClockStart.Add(time.Hour)))
		c := b.closeNov(ctx, t) // November 14th, before the period's end
		requireCredits(t, ctx, b, c, "expires-before-the-end", int64(100), "now", int64(100))
	})

	t.Run("TwoClosesShareAGrant", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.grant(ctx, t, "shared", 1500)
		b.record(ctx, t, event("nov", 1000))
		b.Clock.Set(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
		b.record(ctx, t, event("dec", 1000))
		// Both closes read the grants, then wait to insert their charge
		// (SHARE blocks the inserts, not the reads): what the first applies
		// must be seen by the second, once it runs.
		hold, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = hold.Rollback(ctx) }()
		_, err = hold.Exec(ctx, `LOCK TABLE billing.charges IN SHARE MODE`)
		require.NoError(t, err)
		var wg sync.WaitGroup
		charges := make([]*ledger.Charge, 2)
		for i, period := range []string{"2026-11", "2026-12"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: period, Actor: "job:1/1"})
				if err != nil {
					t.Errorf("close %s: %v", period, err)
				}
				charges[i] = c
			}()
		}
		for i := 0; b.Count(t, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`) < 2; i++ {
			require.Less(t, i, 1000, "both closes wait")
			time.Sleep(10 * time.Millisecond)
		}
		require.NoError(t, hold.Rollback(ctx))
		wg.Wait()
		require.Equal(t, int64(500), charges[0].AmountCents+charges[1].AmountCents, "1500 of 2000 covered, once")
		require.Zero(t, b.remaining(t, "shared"))
		require.Equal(t, int64(-1500), b.Count(t, `SELECT sum(amount_cents) FROM billing.credit_grant_entries WHERE kind = 'applied'`))
	})
}

func TestCreditGrants(t *testing.T) {
	t.Parallel()

	t.Run("IdempotentOnGrantID", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		at := ledgertest.ClockStart.AddDate(0, 1, 0)
		p := ledger.CreditGrantParams{CustomerID: "acme", GrantID: "g", AmountCents: 500, Currency: "usd",
			Category: ledger.CreditPaid, ExpiresAt: &at, Metrics: []string{"b", "a", "b"}, Actor: "operator:test"}
		g, created, err := b.Ledger.CreditGrantCreate(ctx, p)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, []string{"a", "b"}, g.Metrics)
		require.Equal(t, int32(ledger.CreditPriorityDefault), g.Priority)
		require.Equal(t, int64(500), g.RemainingCents)
		require.Equal(t, ledger.GrantActive, g.Status)

		p.Metrics = []string{"a", "b"}
		again, created, err := b.Ledger.CreditGrantCreate(ctx, p)
		require.NoError(t, err)
		require.False(t, created, "a replay")
		require.Equal(t, g, again)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.credit_grant_entries`))

		p.AmountCents = 600
		_, _, err = b.Ledger.CreditGrantCreate(ctx, p)
		requireConflict(t, err, ledger.ConflictGrantIDReused)
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		past := ledgertest.ClockStart.Add(-time.Second)
		for field, change := range map[string]func(*ledger.CreditGrantParams){
			"grant_id":     func(p *ledger.CreditGrantParams) { p.GrantID = "" },
			"amount_cents": func(p *ledger.CreditGrantParams) { p.AmountCents = 0 },
			"currency":     func(p *ledger.CreditGrantParams) { p.Currency = "USD" },
			"category":     func(p *ledger.CreditGrantParams) { p.Category = "free" },
			"priority":     func(p *ledger.CreditGrantParams) { p.Priority = ptr(int32(-1)) },
			"expires_at":   func(p *ledger.CreditGrantParams) { p.ExpiresAt = &past },
			"metrics":      func(p *ledger.CreditGrantParams) { p.Metrics = []string{""} },
		} {
			p := ledger.CreditGrantParams{CustomerID: "acme", GrantID: "g", AmountCents: 1, Currency: "usd",
				Category: ledger.CreditPaid, Actor: "operator:test"}
			change(&p)
			_, _, err := b.Ledger.CreditGrantCreate(ctx, p)
			var ve *ledger.ValidationError
			require.ErrorAs(t, err, &ve, field)
			require.Contains(t, ve.Fields, field)
		}
		_, _, err := b.Ledger.CreditGrantCreate(ctx, ledger.CreditGrantParams{CustomerID: "nobody", GrantID: "g",
			AmountCents: 1, Currency: "usd", Category: ledger.CreditPaid, Actor: "operator:test"})
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})

	t.Run("VoidEndsWhatIsLeft", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.grant(ctx, t, "g", 1000)
		b.grant(ctx, t, "spent", 100)
		b.record(ctx, t, event("p", 400))
		b.closeNov(ctx, t) // same priority and age: g, then spent (by grant_id)
		require.Equal(t, int64(600), b.remaining(t, "g"))

		p := ledger.CreditGrantVoidParams{CustomerID: "acme", GrantID: "g", Reason: "granted by mistake", Actor: "operator:test"}
		e, created, err := b.Ledger.CreditGrantVoid(ctx, p)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, ledger.CreditVoided, e.Kind)
		require.Equal(t, int64(-600), e.AmountCents)
		require.Zero(t, b.remaining(t, "g"))

		again, created, err := b.Ledger.CreditGrantVoid(ctx, p)
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, e, again)

		_, _, err = b.Ledger.CreditGrantVoid(ctx, ledger.CreditGrantVoidParams{CustomerID: "acme", GrantID: "nope", Reason: "x", Actor: "operator:test"})
		require.ErrorIs(t, err, ledger.ErrNotFound)

		// Spend "spent" whole, then it has nothing to void.
		b.Clock.Set(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
		b.record(ctx, t, event("dec", 100))
		_, err = b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-12", Actor: "job:2/1"})
		require.NoError(t, err)
		_, _, err = b.Ledger.CreditGrantVoid(ctx, ledger.CreditGrantVoidParams{CustomerID: "acme", GrantID: "spent", Reason: "x", Actor: "operator:test"})
		requireConflict(t, err, ledger.ConflictGrantExhausted)

		credits, err := b.Ledger.CustomerCredits(ctx, ledger.CreditsParams{CustomerID: "acme"})
		require.NoError(t, err)
		require.Empty(t, credits.Balances, "nothing left")
		require.Len(t, credits.Grants, 2)
		require.Equal(t, ledger.GrantVoided, credits.Grants[0].Status)
		require.Equal(t, ledger.GrantUsedUp, credits.Grants[1].Status)
	})

	t.Run("AChainNeverBelowZeroAndAppendOnly", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.grant(ctx, t, "g", 100)
		for stmt, want := range map[string]string{
			// what is left after an entry may not go below zero,
			`(2, 'voided', -101, -1)`: "credit_grant_entries_remaining_cents_check",
			// and an entry may not take the place of another.
			`(1, 'voided', -100, 0)`: "credit_grant_entries_check",
		} {
			_, err := b.Pool.Exec(ctx, `INSERT INTO billing.credit_grant_entries
(customer_id, grant_id, seq, kind, amount_cents, remaining_cents, reason, actor, created_at)
SELECT 'acme', 'g', s, k, a, r, 'wrong', 'test', now() FROM (VALUES `+stmt+`) AS v (s, k, a, r)`)
			require.ErrorContains(t, err, want, stmt)
		}
		require.Zero(t, b.Count(t, `SELECT count(*) FROM billing.credit_chain_breaks`))
		_, err := b.Pool.Exec(ctx, `INSERT INTO billing.credit_grant_entries
(customer_id, grant_id, seq, kind, amount_cents, remaining_cents, reason, actor, created_at)
VALUES ('acme', 'g', 2, 'voided', -100, 0, 'right', 'test', now())`)
		require.NoError(t, err, "the next entry of the chain")
		_, err = b.Pool.Exec(ctx, `INSERT INTO billing.credit_grant_entries
(customer_id, grant_id, seq, kind, amount_cents, remaining_cents, reason, actor, created_at)
VALUES ('acme', 'g', 2, 'expired', -100, 0, NULL, 'test', now())`)
		require.ErrorContains(t, err, "duplicate key", "two writers appending to the same entry: one fails")
		_, err = b.Pool.Exec(ctx, `INSERT INTO billing.credit_grant_entries
(customer_id, grant_id, seq, kind, amount_cents, remaining_cents, charge_id, actor, created_at)
SELECT 'acme', 'g', 4, 'applied', -1, 5, id, 'test', now() FROM billing.charges LIMIT 1`)
		require.NoError(t, err) // no charge: nothing inserted
		b.record(ctx, t, event("p", 100))
		c := b.closeNov(ctx, t)
		_, err = b.Pool.Exec(ctx, `INSERT INTO billing.credit_grant_entries
(customer_id, grant_id, seq, kind, amount_cents, remaining_cents, charge_id, actor, created_at)
VALUES ('acme', 'g', 4, 'applied', -1, 5, $1, 'test', now())`, c.ID)
		require.NoError(t, err, "a wrong sum and a gap: written by hand, shown by the view")
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM billing.credit_chain_breaks`))
		_, err = b.Pool.Exec(ctx, `UPDATE billing.credit_grants SET amount_cents = 1`)
		require.ErrorContains(t, err, "append-only")
		_, err = b.Pool.Exec(ctx, `DELETE FROM billing.credit_grant_entries`)
		require.ErrorContains(t, err, "append-only")
	})

	t.Run("BalancesAndEntriesPaged", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.grant(ctx, t, "promo", 100)
		b.grant(ctx, t, "paid", 200, func(p *ledger.CreditGrantParams) { p.Category = ledger.CreditPaid })
		b.grant(ctx, t, "paid-eur", 300, func(p *ledger.CreditGrantParams) { p.Category = ledger.CreditPaid; p.Currency = "eur" })
		credits, err := b.Ledger.CustomerCredits(ctx, ledger.CreditsParams{CustomerID: "acme", EntriesLimit: 2})
		require.NoError(t, err)
		require.Equal(t, []ledger.CreditBalance{
			{Currency: "eur", Category: ledger.CreditPaid, RemainingCents: 300},
			{Currency: "usd", Category: ledger.CreditPaid, RemainingCents: 200},
			{Currency: "usd", Category: ledger.CreditPromotional, RemainingCents: 100},
		}, credits.Balances)
		require.Len(t, credits.Entries, 2)
		require.True(t, credits.EntriesMore)
		rest, err := b.Ledger.CustomerCredits(ctx, ledger.CreditsParams{CustomerID: "acme", EntriesAfter: credits.Entries[1].ID})
		require.NoError(t, err)
		require.Len(t, rest.Entries, 1)
		require.False(t, rest.EntriesMore)
		require.Equal(t, "paid-eur", rest.Entries[0].GrantID)

		_, err = b.Ledger.CustomerCredits(ctx, ledger.CreditsParams{CustomerID: "nobody"})
		require.ErrorIs(t, err, ledger.ErrNotFound)
	})
}

// What is left of a grant at its expiry is written off by the sweep, once
// no open period can still apply it, and notified.
func TestCreditGrantsExpire(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	b.subscribe(t, ctx, ledger.NotifyCreditGrantExpired)
	b.grant(ctx, t, "dec-10", 1500, expiresAt(time.Date(2026, 12, 10, 0, 0, 0, 0, time.UTC)))
	b.grant(ctx, t, "later", 100, expiresAt(time.Date(2027, 1, 10, 0, 0, 0, 0, time.UTC)))
	b.record(ctx, t, event("p", 1000))

	b.Clock.Set(time.Date(2026, 12, 11, 0, 0, 0, 0, time.UTC))
	expired, err := b.Ledger.CreditGrantsExpire(ctx, "job:9/1")
	require.NoError(t, err)
	require.Empty(t, expired, "November is open: its close may still apply dec-10")

	c := b.closeNov(ctx, t)
	requireCredits(t, ctx, b, c, "dec-10", int64(1000))
	expired, err = b.Ledger.CreditGrantsExpire(ctx, "job:9/1")
	require.NoError(t, err)
	require.Equal(t, []ledger.GrantExpiry{{CustomerID: "acme", GrantID: "dec-10", Currency: "usd", AmountCents: 500,
		ExpiresAt: time.Date(2026, 12, 10, 0, 0, 0, 0, time.UTC)}}, expired)
	require.Zero(t, b.remaining(t, "dec-10"))
	require.Equal(t, int64(100), b.remaining(t, "later"))
	require.Equal(t, []string{ledger.NotifyCreditGrantExpired}, b.notifications(t, ctx))
	require.Equal(t, "expired", b.text(t, `SELECT body -> 'data' -> 'object' ->> 'status' FROM billing.notifications`))

	expired, err = b.Ledger.CreditGrantsExpire(ctx, "job:10/1")
	require.NoError(t, err)
	require.Empty(t, expired, "once")
	require.Equal(t, int64(-500), b.Count(t, `SELECT amount_cents FROM billing.credit_entries WHERE kind = 'expired'`))
	require.Zero(t, b.Count(t, `SELECT remaining_cents FROM billing.credit_entries WHERE kind = 'expired'`),
		"the view's running remainder")
}
