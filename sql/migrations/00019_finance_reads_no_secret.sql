-- tally_readonly (00012) reads no secret (GitHub issue 22). 00012 granted it
-- SELECT on every future table of billing by default, so the webhook tables
-- (00015) came with their signing secrets, and stripe_events with the
-- client_secret of every PaymentIntent. From here on:
--
-- * Nothing is granted by default. A migration that creates a table or view
--   finance should read grants it in the same migration, naming its columns
--   when some hold a secret (docs/sql.md, "A new table"):
--       DO $$ BEGIN
--           IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
--               GRANT SELECT ON billing.new_table TO tally_readonly;
--           END IF;
--       END $$;
-- * A column that is a secret is left out of a column-level grant:
--   webhook_endpoints' secret and previous_secret (and previous_secret_until),
--   its url (a receiver may put a token in it) and disabled_reason (it quotes
--   the last error), webhook_attempts' error (net/http's quote the URL) and
--   response_excerpt (the receiver's answer).
-- * A column that holds secrets among what finance needs is read through a
--   view that redacts it: stripe_events_redacted is stripe_events with every
--   client_secret and secret removed from the payload, at any depth.
-- * api_keys stays unreadable.
--
-- TestSQLSurfaceSecrets (internal/ledger) writes canary secrets everywhere
-- Tally keeps one and fails if tally_readonly can read any of them, or any
-- column named like a secret that it has not reviewed.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION billing.jsonb_strip_secrets(j jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT CASE jsonb_typeof(j)
    WHEN 'object' THEN (SELECT coalesce(jsonb_object_agg(k, billing.jsonb_strip_secrets(v)), '{}')
                        FROM jsonb_each(j) AS e (k, v)
                        WHERE k NOT IN ('client_secret', 'secret'))
    WHEN 'array' THEN (SELECT coalesce(jsonb_agg(billing.jsonb_strip_secrets(v) ORDER BY i), '[]')
                       FROM jsonb_array_elements(j) WITH ORDINALITY AS a (v, i))
    ELSE j
END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION billing.jsonb_strip_secrets(jsonb) IS
    'j without the members named client_secret or secret, at any depth (a PaymentIntent''s, '
    'a SetupIntent''s or a Checkout Session''s client_secret, an ephemeral key''s secret).';

CREATE VIEW billing.stripe_events_redacted AS
SELECT id, type, payload -> 'data' -> 'object' ->> 'id' AS object_id,
       billing.jsonb_strip_secrets(payload) AS payload, livemode, created_at, received_at, status, attempts,
       last_error, processed_at, job_id, stuck_alerted_at
FROM billing.stripe_events;

COMMENT ON VIEW billing.stripe_events_redacted IS
    'The Stripe events Tally stored, without their secrets (billing.jsonb_strip_secrets): what finance reads '
    'instead of billing.stripe_events. object_id is the id of the object the event is about.';

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        RAISE WARNING 'tally_readonly does not exist (00012 could not create it): nothing granted. As a superuser: '
            'CREATE ROLE tally_readonly NOLOGIN; then migrate down and up while 00019 is the latest migration, '
            'or run its grants by hand';
        RETURN;
    END IF;
    ALTER DEFAULT PRIVILEGES IN SCHEMA billing REVOKE SELECT ON TABLES FROM tally_readonly;
    -- Every grant, from scratch: this is the whole of what finance reads.
    REVOKE ALL ON ALL TABLES IN SCHEMA billing FROM tally_readonly;
    GRANT USAGE ON SCHEMA billing TO tally_readonly;
    GRANT SELECT ON
        billing.customers, billing.periods, billing.usage_events,
        billing.charges, billing.charge_attempts, billing.charge_transitions, billing.charge_status_transitions,
        billing.operator_actions, billing.refunds, billing.refund_events, billing.disputes, billing.dispute_events,
        billing.notifications, billing.webhook_deliveries, billing.usage_thresholds_reached,
        billing.usage_threshold_scan, billing.operations_snapshot, billing.goose_db_version,
        billing.period_totals, billing.reconciliation, billing.charges_open, billing.charge_adjustments,
        billing.customer_carried_forward, billing.refunds_current, billing.disputes_current,
        billing.period_spend, billing.stripe_events_redacted
    TO tally_readonly;
    GRANT SELECT (id, events, description, disabled_at, deleted_at, created_at, updated_at)
        ON billing.webhook_endpoints TO tally_readonly;
    GRANT SELECT (delivery_id, attempt, started_at, latency_ms, status_code)
        ON billing.webhook_attempts TO tally_readonly;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Back to 00012's grants, leaks included: every table but api_keys, and
-- every future one by default (00017's Down recreates charges_open and
-- counts on it).
DROP VIEW billing.stripe_events_redacted;
DROP FUNCTION billing.jsonb_strip_secrets(jsonb);
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        REVOKE ALL ON ALL TABLES IN SCHEMA billing FROM tally_readonly;
        GRANT SELECT ON ALL TABLES IN SCHEMA billing TO tally_readonly;
        REVOKE SELECT ON billing.api_keys FROM tally_readonly;
        ALTER DEFAULT PRIVILEGES IN SCHEMA billing GRANT SELECT ON TABLES TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd
