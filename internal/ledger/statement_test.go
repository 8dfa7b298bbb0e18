package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// statementNumbers returns every statement's number, in order.
func (b *testBundle) statementNumbers(t *testing.T, ctx context.Context) []int64 {
	t.Helper()
	rows, err := b.Pool.Query(ctx, `SELECT number FROM billing.statements ORDER BY number`)
	require.NoError(t, err)
	var out []int64
	for rows.Next() {
		var n int64
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
	return out
}

// A settled charge has a statement whose number is taken when it settles:
// from 1, without gaps, never twice.
func TestChargeStatement(t *testing.T) {
	t.Parallel()

	t.Run("NumberedWhenSettled", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.record(ctx, t, event("e", 1000))
		b.grant(ctx, t, "welcome", 300)
		pending, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
		require.NoError(t, err)
		_, err = b.Ledger.ChargeStatement(ctx, pending.ID)
		requireConflict(t, err, ledger.ConflictChargeNotSettled)

		c := b.settle(t, ctx, ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_1"})
		require.Equal(t, ledger.ChargeSucceeded, c.Status)
		s, err := b.Ledger.ChargeStatement(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, int64(1), s.Number)
		require.Equal(t, int64(700), s.Charge.AmountCents)
		require.Len(t, s.Lines, 2)
		require.Equal(t, ledger.ChargeLineCredit, s.Lines[1].Kind)

		b.Customer(t, "beta")
		_, err = b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "beta", EventID: "e", AmountCents: 100})
		require.NoError(t, err)
		_, _, err = b.Ledger.CreditGrantCreate(ctx, ledger.CreditGrantParams{CustomerID: "beta", GrantID: "g", AmountCents: 100,
			Currency: "usd", Category: ledger.CreditPaid, Actor: "operator:test"})
		require.NoError(t, err)
		covered, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "beta", Period: "2026-11", Actor: "job:2/1"})
		require.NoError(t, err)
		require.Equal(t, ledger.ChargeCovered, covered.Status)
		s, err = b.Ledger.ChargeStatement(ctx, covered.ID)
		require.NoError(t, err)
		require.Equal(t, int64(2), s.Number, "covered by credits is settled too")

		_, err = b.Ledger.ChargeStatement(ctx, 999_999)
		require.ErrorIs(t, err, ledger.ErrNotFound)
		_, err = b.Pool.Exec(ctx, `UPDATE billing.statements SET number = 7`)
		require.ErrorContains(t, err, "append-only")
	})

	t.Run("NoGapsWhenConcurrentOrRolledBack", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{noCustomer: true})
		// A close of "fails" dies after its charge settled (covered): its
		// number goes back with it.
		_, err := b.Pool.Exec(ctx, `
CREATE FUNCTION pg_temp_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT customer_id FROM billing.charges WHERE id = NEW.charge_id) = 'fails' THEN
        RAISE EXCEPTION 'the close of fails dies here';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_after_settle AFTER INSERT ON billing.charge_transitions
    FOR EACH ROW EXECUTE FUNCTION pg_temp_fail();`)
		require.NoError(t, err)
		ids := []string{"fails"}
		for i := range 8 {
			ids = append(ids, fmt.Sprintf("c%d", i))
		}
		for _, id := range ids {
			b.Customer(t, id)
			_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: id, EventID: "e", AmountCents: 100})
			require.NoError(t, err)
			_, _, err = b.Ledger.CreditGrantCreate(ctx, ledger.CreditGrantParams{CustomerID: id, GrantID: "g", AmountCents: 100,
				Currency: "usd", Category: ledger.CreditPaid, Actor: "operator:test"})
			require.NoError(t, err)
		}
		_, err = b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "fails", Period: "2026-11", Actor: "job:1/1"})
		require.ErrorContains(t, err, "dies here")
		var wg sync.WaitGroup
		for _, id := range ids[1:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: id, Period: "2026-11", Actor: "job:1/1"}); err != nil {
					t.Errorf("close %s: %v", id, err)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7, 8}, b.statementNumbers(t, ctx))
		require.Equal(t, int64(8), b.Count(t, `SELECT last_number FROM billing.statement_counter`))
	})
}

// The statement counter's row, which every settling transaction locks, is
// taken just before the commit: a transaction that settled a charge and
// goes on (River completing its job, the notifications) does not hold the
// other settling transactions back meanwhile.
func TestStatementNumberTakenAtCommit(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	b.record(ctx, t, event("e", 1000))
	cc, err := b.closeClaim(ctx, "w", "", true)
	require.NoError(t, err)
	claim, err := b.Ledger.ChargeLookupNone(ctx, cc.Claim, "job:1/1")
	require.NoError(t, err)
	c, err := b.Ledger.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_1"},
		"job:1/1", func(ctx context.Context, tx *ledger.Tx) error {
			// What the charge's transition queued has been sent by now.
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return err
			}
			other, err := b.Pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = other.Rollback(ctx) }()
			var n int64
			if err := other.QueryRow(ctx, `SELECT last_number FROM billing.statement_counter FOR UPDATE NOWAIT`).Scan(&n); err != nil {
				return fmt.Errorf("the counter is locked before the commit: %w", err)
			}
			if n != 0 {
				return fmt.Errorf("counter at %d before the commit", n)
			}
			return nil
		})
	require.NoError(t, err)
	require.Equal(t, ledger.ChargeSucceeded, c.Status)
	require.Equal(t, []int64{1}, b.statementNumbers(t, ctx))
}
