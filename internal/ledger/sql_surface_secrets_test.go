package ledger_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// secretColumnName matches the names of columns that may hold a secret or a
// raw body from someone else: finance may read none of them, except the
// reviewed ones in secretColumnReviewed.
var secretColumnName = regexp.MustCompile(`(?i)secret|hash|token|passw|credential|payload|body|response|excerpt|signature|url`)

// secretColumnReviewed are the readable columns whose names secretColumnName
// matches but that hold no secret, each with the reason.
var secretColumnReviewed = map[string]string{
	"billing.stripe_events_redacted.payload": "the Stripe event without client_secret and secret at any depth (billing.jsonb_strip_secrets)",
	"billing.notifications.body":             "the public API's objects Tally posts to webhook endpoints; the signature is in a header, never stored",
	"billing.usage_events.payload_hash":      "a digest of the producer's own usage event, which finance reads in full",
}

// readableColumn is a column the connected role may select.
type readableColumn struct {
	Relation string // schema.name, quoted where needed
	Column   string
}

// readableColumns returns every column of every table, view and foreign
// table outside the system schemas that q's role may select, itself or
// through the roles it is a member of.
func readableColumns(ctx context.Context, t *testing.T, q querier) []readableColumn {
	t.Helper()
	rows, err := q.Query(ctx, `
SELECT format('%I.%I', n.nspname, c.relname), a.attname
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\_toast%'
  AND has_schema_privilege(n.oid, 'USAGE')
  AND has_column_privilege(c.oid, a.attnum, 'SELECT')
ORDER BY 1, a.attnum`)
	require.NoError(t, err)
	cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[readableColumn])
	require.NoError(t, err)
	return cols
}

// querier runs a query: a connection or a pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// canariesIn reads, as q's role, every column it may select of every
// relation it may read (readableColumns), as text, and returns where each
// of canaries (value -> what it is) shows up.
func canariesIn(ctx context.Context, t *testing.T, q querier, canaries map[string]string) map[string][]string {
	t.Helper()
	byRelation := map[string][]string{}
	var relations []string
	for _, c := range readableColumns(ctx, t, q) {
		if byRelation[c.Relation] == nil {
			relations = append(relations, c.Relation)
		}
		byRelation[c.Relation] = append(byRelation[c.Relation], c.Column)
	}
	require.Contains(t, relations, "billing.charges", "the enumeration sees what finance reads")
	found := map[string][]string{}
	for _, rel := range relations {
		cols := byRelation[rel]
		exprs := make([]string, len(cols))
		for i, c := range cols {
			exprs[i] = pgx.Identifier{c}.Sanitize() + "::text"
		}
		// rel is qualified and quoted (readableColumns).
		rows, err := q.Query(ctx, `SELECT `+strings.Join(exprs, ", ")+` FROM `+rel)
		require.NoError(t, err, "%s", rel)
		for rows.Next() {
			for i, v := range rows.RawValues() {
				for canary, what := range canaries {
					if strings.Contains(string(v), canary) {
						found[canary] = append(found[canary], fmt.Sprintf("%s in %s.%s", what, rel, cols[i]))
					}
				}
			}
		}
		require.NoError(t, rows.Err(), "%s", rel)
	}
	return found
}

// TestSQLSurfaceSecrets checks that tally_readonly reads no secret: no
// column it may select is named like one (unless reviewed), and none of the
// canaries written where Tally keeps secrets — webhook signing secrets and
// URLs, API key hashes, Stripe's client_secrets, receivers' answers — shows
// up in anything it may select.
func TestSQLSurfaceSecrets(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	finance := financeConn(t, b)

	t.Run("CanariesUnreadable", func(t *testing.T) {
		canaries := map[string]string{} // value -> where it was written
		random := func(what string) string {
			buf := make([]byte, 8)
			_, _ = rand.Read(buf)
			s := "canary" + hex.EncodeToString(buf)
			canaries[s] = what
			return s
		}

		// A webhook endpoint whose URL carries a token, with a rotated
		// secret: the current and the previous one.
		endpointURL := "https://hooks.example.com/services/T0/B0?token=" + random("the webhook endpoint's URL")
		e, err := b.Ledger.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: endpointURL, Events: []string{ledger.NotifyAll}})
		require.NoError(t, err)
		canaries[e.Secret] = "webhook_endpoints.previous_secret"
		e, err = b.Ledger.WebhookEndpointRotateSecret(ctx, e.ID, time.Hour)
		require.NoError(t, err)
		canaries[e.Secret] = "webhook_endpoints.secret"

		// A delivery of the period's close to it, answered with a body, then
		// failed without an answer: the error names the URL (as
		// net/http's does), and the endpoint is disabled with it.
		_, err = b.Ledger.UsageEventRecord(ctx, event("e1", 100))
		require.NoError(t, err)
		b.close(t, ctx)
		var deliveryID int64
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT id FROM billing.webhook_deliveries WHERE endpoint_id = $1`, e.ID).Scan(&deliveryID))
		_, err = b.Ledger.WebhookAttemptRecord(ctx, ledger.WebhookAttempt{DeliveryID: deliveryID, StartedAt: b.Clock.Now(),
			StatusCode: 500, Error: "answered 500 Internal Server Error",
			Excerpt: `{"error":"session expired","session":"` + random("a receiver's answer") + `"}`})
		require.NoError(t, err)
		netErr := &url.Error{Op: "Post", URL: endpointURL, Err: errors.New("dial tcp 192.0.2.1:443: connect: connection refused")}
		rec, err := b.Ledger.WebhookAttemptRecord(ctx, ledger.WebhookAttempt{DeliveryID: deliveryID, StartedAt: b.Clock.Now(),
			Error: netErr.Error(), Last: true})
		require.NoError(t, err)
		require.True(t, rec.Disabled, "the endpoint's reason quotes the error")

		// An API key: its secret is never stored, its hash is.
		key, _, err := b.Ledger.APIKeyCreate(ctx, "finance-test", []ledger.Scope{ledger.ScopeAdmin})
		require.NoError(t, err)
		canaries[key] = "an API key"
		sum := sha256.Sum256([]byte(key))
		canaries[hex.EncodeToString(sum[:])] = "api_keys.secret_sha256"

		// Stripe events carrying client_secrets where Stripe puts them: the
		// object, previous_attributes, an object nested in a list; and an
		// ephemeral key's secret.
		for i, ev := range []struct{ typ, payload string }{
			{"payment_intent.succeeded", `{"data":{"object":{"id":"pi_canary","object":"payment_intent","amount_received":100,
			  "client_secret":"pi_canary_secret_` + random("a PaymentIntent's client_secret") + `"}}}`},
			{"setup_intent.succeeded", `{"data":{"object":{"id":"seti_canary","object":"setup_intent",
			  "client_secret":"seti_canary_secret_` + random("a SetupIntent's client_secret") + `"},
			  "previous_attributes":{"client_secret":"seti_canary_secret_` + random("previous_attributes.client_secret") + `"}}}`},
			{"invoice.paid", `{"data":{"object":{"id":"in_canary","object":"invoice",
			  "payments":{"object":"list","data":[{"payment":{"payment_intent":{"id":"pi_nested",
			  "client_secret":"pi_nested_secret_` + random("a client_secret nested in a list") + `"}}}]},
			  "ephemeral_key":{"secret":"ek_test_` + random("an ephemeral key's secret") + `"}}}}`},
		} {
			_, err := b.Ledger.StripeEventRecord(ctx, ledger.StripeEventParams{
				ID: fmt.Sprintf("evt_canary_%d", i), Type: ev.typ, Payload: []byte(ev.payload), CreatedAt: b.Clock.Now()})
			require.NoError(t, err)
		}

		require.Empty(t, canariesIn(ctx, t, finance, canaries), "tally_readonly reads secrets")
		// The owner finds every canary but the API key (only its hash is
		// stored): they were written, and the search sees them.
		seen := canariesIn(ctx, t, b.Pool, canaries)
		for canary, what := range canaries {
			if canary != key {
				require.NotEmpty(t, seen[canary], "%s is stored", what)
			}
		}

		// What finance needs of the event is still there.
		var id string
		var received int64
		require.NoError(t, finance.QueryRow(ctx, `
SELECT object_id, (payload -> 'data' -> 'object' ->> 'amount_received')::bigint
FROM billing.stripe_events_redacted WHERE type LIKE 'payment_intent.%' AND object_id = 'pi_canary'`).Scan(&id, &received))
		require.Equal(t, "pi_canary", id)
		require.Equal(t, int64(100), received)
	})

	t.Run("NewTableNotReadable", func(t *testing.T) {
		// A table a later migration creates is readable only once granted.
		_, err := b.Pool.Exec(ctx, `CREATE TABLE billing.later_notes (note text); INSERT INTO billing.later_notes VALUES ('x')`)
		require.NoError(t, err)
		_, err = finance.Exec(ctx, `SELECT note FROM billing.later_notes`)
		require.ErrorContains(t, err, "permission denied")
	})

	t.Run("NoSecretColumnNames", func(t *testing.T) {
		for _, c := range readableColumns(ctx, t, finance) {
			name := c.Relation + "." + c.Column
			if secretColumnName.MatchString(c.Column) && secretColumnReviewed[name] == "" {
				t.Errorf("tally_readonly reads %s, named like a secret: revoke it, or redact it in a view and review it in secretColumnReviewed", name)
			}
		}
	})
}
