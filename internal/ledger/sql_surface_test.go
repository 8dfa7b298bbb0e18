package ledger_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// financeConn connects to b's database as a new login role that is a
// member of tally_readonly, dropped when the test ends.
func financeConn(t *testing.T, b *testBundle) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	role := "tally_finance_" + hex.EncodeToString(suffix)
	_, err := b.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN IN ROLE tally_readonly`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.Pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+role) })

	u, err := url.Parse(b.URL)
	require.NoError(t, err)
	u.User = url.User(role)
	conn, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// The SQL surface for finance: the views answer, tally_readonly reads the
// billing schema and nothing else, and every query of docs/sql.md runs.
func TestSQLSurface(t *testing.T) {
	ctx, b := setup(t, setupOpts{noCustomer: true})
	for _, id := range []string{"acme", "beta", "gamma"} {
		b.Customer(t, id)
		for i, amount := range []int64{1200, 800} {
			_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{
				CustomerID: id, EventID: "e" + string(rune('1'+i)), AmountCents: amount, Metric: "api_calls"})
			require.NoError(t, err)
		}
	}
	for _, id := range []string{"acme", "beta", "gamma"} {
		_, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: id, Period: "2026-11", Actor: "job:1/1"})
		require.NoError(t, err)
	}
	// acme succeeded and Stripe agrees; beta succeeded but Stripe reported
	// another amount; gamma is held.
	_, err := b.Pool.Exec(ctx, `
UPDATE billing.charges SET status = 'succeeded', stripe_payment_intent_id = 'pi_' || customer_id
WHERE customer_id IN ('acme', 'beta');
UPDATE billing.charges SET status = 'held', held_reason = 'over_customer_cap', held_detail = 'test', held_at = now()
WHERE customer_id = 'gamma';
INSERT INTO billing.stripe_events (id, type, payload, created_at, received_at, status, processed_at)
VALUES ('evt_acme', 'payment_intent.succeeded', '{"data":{"object":{"id":"pi_acme","amount_received":2000}}}', now(), now(), 'processed', now()),
       ('evt_beta', 'payment_intent.succeeded', '{"data":{"object":{"id":"pi_beta","amount_received":1999}}}', now(), now(), 'processed', now())`)
	require.NoError(t, err)
	// acme bought credits: a top-up whose PaymentIntent succeeded, and its
	// grant; beta's top-up is still pending.
	_, _, err = b.Ledger.TopUpCreate(ctx, ledger.TopUpParams{CustomerID: "acme", TopUpID: "tu-1", AmountCents: 5000,
		Actor: "operator:test"})
	require.NoError(t, err)
	_, _, err = b.Ledger.TopUpCreate(ctx, ledger.TopUpParams{CustomerID: "beta", TopUpID: "tu-1", AmountCents: 2500,
		Actor: "operator:test"})
	require.NoError(t, err)
	require.NoError(t, b.Ledger.InTx(ctx, func(tx *ledger.Tx) error {
		_, _, err := b.Ledger.TopUpReconcileTx(ctx, tx, ledger.TopUpReconcileParams{
			Key: ledger.TopUpKey(b.Ledger.Namespace(), "acme", "tu-1"), Actor: "webhook:evt_tu",
			Outcome: ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_tu"}})
		return err
	}))

	finance := financeConn(t, b)

	t.Run("DocsQueries", func(t *testing.T) {
		doc, err := os.ReadFile("../../docs/sql.md")
		require.NoError(t, err)
		blocks := regexp.MustCompile("(?s)### [^\n]+\n\n```sql\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
		require.GreaterOrEqual(t, len(blocks), 22, "docs/sql.md has its twenty-two questions")
		for _, block := range blocks {
			query := strings.TrimSpace(block[1])
			rows, err := finance.Query(ctx, query)
			require.NoError(t, err, "%s", query)
			for rows.Next() {
			}
			require.NoError(t, rows.Err(), "%s", query)
		}
	})

	t.Run("PeriodTotalsAndOpenCharges", func(t *testing.T) {
		var total, amount int64
		var status string
		require.NoError(t, finance.QueryRow(ctx, `
SELECT total_cents, charge_amount_cents, charge_status FROM billing.period_totals
WHERE customer_id = 'acme' AND period = '2026-11'`).Scan(&total, &amount, &status))
		require.Equal(t, int64(2000), total)
		require.Equal(t, int64(2000), amount)
		require.Equal(t, "succeeded", status)
		var held string
		require.NoError(t, finance.QueryRow(ctx, `SELECT customer_id FROM billing.charges_open WHERE status = 'held'`).Scan(&held))
		require.Equal(t, "gamma", held)
	})

	t.Run("ReadOnlyAndBillingOnly", func(t *testing.T) {
		for _, stmt := range []string{
			`INSERT INTO billing.customers (customer_id, stripe_customer_id, currency, created_at, updated_at) VALUES ('x', 'cus_x', 'usd', now(), now())`,
			`UPDATE billing.charges SET amount_cents = 1`,
			`DELETE FROM billing.periods`,
			`SELECT count(*) FROM billing.api_keys`,
			`SELECT secret FROM billing.webhook_endpoints`,
			`SELECT payload FROM billing.stripe_events`,
			`SELECT count(*) FROM river.river_job`,
			`CREATE TABLE billing.notes (x int)`,
		} {
			_, err := finance.Exec(ctx, stmt)
			require.ErrorContains(t, err, "permission denied", "%s", stmt)
		}
	})

	t.Run("Reconciliation", func(t *testing.T) {
		rows, err := finance.Query(ctx, `SELECT customer_id, disagreement, stripe_received_cents FROM billing.reconciliation`)
		require.NoError(t, err)
		type row struct {
			Customer, Disagreement string
			Stripe                 *int64
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.Customer, &x.Disagreement, &x.Stripe)
			return x, err
		})
		require.NoError(t, err)
		require.Len(t, got, 1, "only beta disagrees: %+v", got)
		require.Equal(t, "beta", got[0].Customer)
		require.Equal(t, "stripe_differs_from_charge", got[0].Disagreement)
		require.Equal(t, int64(1999), *got[0].Stripe)
	})
}
