-- The SQL surface for finance (docs/sql.md): views for the questions finance
-- asks, and tally_readonly, a NOLOGIN role that may read the billing schema
-- (not API keys) and nothing else. Grant it to a login role:
--   CREATE ROLE alice LOGIN IN ROLE tally_readonly;

-- +goose Up
CREATE VIEW billing.period_totals AS
SELECT p.customer_id, p.period, p.currency, p.status AS period_status, p.starts_at, p.ends_at, p.closes_at,
       p.closed_at, coalesce(t.event_count, 0) AS event_count, coalesce(t.total_cents, 0)::bigint AS total_cents,
       c.id AS charge_id, c.status AS charge_status, c.amount_cents AS charge_amount_cents, c.carried_in_cents
FROM billing.periods p
LEFT JOIN LATERAL (
    SELECT count(*) AS event_count, sum(e.amount_cents) AS total_cents
    FROM billing.usage_events e
    WHERE e.customer_id = p.customer_id AND e.period = p.period
) t ON true
LEFT JOIN billing.charges c ON c.customer_id = p.customer_id AND c.period = p.period;

COMMENT ON VIEW billing.period_totals IS
    'One row per (customer, period): its events'' count and total, and its charge''s status and amount once closed.';

-- The Stripe side of a succeeded charge, from the webhook events Stripe sent.
CREATE INDEX stripe_events_payment_intent_idx ON billing.stripe_events ((payload -> 'data' -> 'object' ->> 'id'))
    WHERE type LIKE 'payment_intent.%';

CREATE VIEW billing.reconciliation AS
WITH charge AS (
    SELECT c.id, c.customer_id, c.period, c.status, c.currency, c.amount_cents, c.carried_in_cents,
           c.stripe_payment_intent_id,
           (SELECT coalesce(sum(e.amount_cents), 0) FROM billing.usage_events e
             WHERE e.customer_id = c.customer_id AND e.period = c.period)::bigint AS events_cents,
           (SELECT (s.payload -> 'data' -> 'object' ->> 'amount_received')::bigint FROM billing.stripe_events s
             WHERE s.type LIKE 'payment_intent.%' AND s.type = 'payment_intent.succeeded'
               AND s.payload -> 'data' -> 'object' ->> 'id' = c.stripe_payment_intent_id
             ORDER BY s.created_at DESC LIMIT 1) AS stripe_received_cents
    FROM billing.charges c
)
SELECT id AS charge_id, customer_id, period, status, currency, events_cents, carried_in_cents, amount_cents,
       stripe_payment_intent_id, stripe_received_cents,
       CASE WHEN events_cents + carried_in_cents <> amount_cents THEN 'ledger_differs_from_charge'
            ELSE 'stripe_differs_from_charge' END AS disagreement
FROM charge
WHERE events_cents + carried_in_cents <> amount_cents
   OR (status = 'succeeded' AND stripe_received_cents IS NOT NULL AND stripe_received_cents <> amount_cents)
UNION ALL
SELECT NULL, p.customer_id, p.period, p.status, p.currency,
       (SELECT coalesce(sum(e.amount_cents), 0) FROM billing.usage_events e
         WHERE e.customer_id = p.customer_id AND e.period = p.period)::bigint, 0, NULL, NULL, NULL,
       'closed_period_without_charge'
FROM billing.periods p
WHERE p.status = 'closed'
  AND NOT EXISTS (SELECT 1 FROM billing.charges c WHERE c.customer_id = p.customer_id AND c.period = p.period);

COMMENT ON VIEW billing.reconciliation IS
    'A row for every disagreement: a charge whose amount is not its period''s events plus what it carries in, '
    'a succeeded charge whose PaymentIntent Stripe reported with another amount_received, a closed period without a charge. '
    'Empty when the ledger, the charges and Stripe agree.';

CREATE VIEW billing.charges_open AS
SELECT id AS charge_id, customer_id, period, status, amount_cents, currency, held_reason, held_detail, held_at,
       attempt_count, last_attempted_at, created_at,
       now() - created_at AS age,
       now() - coalesce(held_at, last_attempted_at, created_at) AS waiting_for
FROM billing.charges
WHERE status IN ('pending', 'unknown', 'processing', 'held');

COMMENT ON VIEW billing.charges_open IS
    'Charges not settled yet — held (waiting for an operator) or in flight — with their age.';

CREATE VIEW billing.charge_adjustments AS
SELECT c.id AS charge_id, c.customer_id, c.period, c.currency, c.amount_cents,
       coalesce(r.refunded_cents, 0)::bigint AS refunded_cents, coalesce(r.refunds, 0) AS refunds,
       coalesce(d.disputed_cents, 0)::bigint AS disputed_cents, coalesce(d.disputes, 0) AS disputes,
       coalesce(d.open_disputes, 0) AS open_disputes, coalesce(d.lost_disputes, 0) AS lost_disputes
FROM billing.charges c
LEFT JOIN (
    SELECT charge_id, sum(amount_cents) FILTER (WHERE status = 'succeeded') AS refunded_cents, count(*) AS refunds
    FROM billing.refunds_current GROUP BY charge_id
) r ON r.charge_id = c.id
LEFT JOIN (
    SELECT charge_id, sum(amount_cents) AS disputed_cents, count(*) AS disputes,
           count(*) FILTER (WHERE status NOT IN ('won', 'lost', 'warning_closed')) AS open_disputes,
           count(*) FILTER (WHERE status = 'lost') AS lost_disputes
    FROM billing.disputes_current GROUP BY charge_id
) d ON d.charge_id = c.id
WHERE r.charge_id IS NOT NULL OR d.charge_id IS NOT NULL;

COMMENT ON VIEW billing.charge_adjustments IS
    'Per charge with refunds or disputes: the amounts refunded (succeeded refunds) and disputed, and the disputes open and lost.';

-- +goose StatementBegin
DO $$
BEGIN
    BEGIN
        CREATE ROLE tally_readonly NOLOGIN;
    EXCEPTION
        WHEN duplicate_object THEN
            NULL; -- roles are cluster-wide: another database's migration made it
        WHEN insufficient_privilege THEN
            RAISE WARNING 'tally_readonly not created: this role may not create roles. As a superuser: '
                'CREATE ROLE tally_readonly NOLOGIN; then run migrate down 1 and up, or grant as below';
            RETURN;
    END;
    GRANT USAGE ON SCHEMA billing TO tally_readonly;
    GRANT SELECT ON ALL TABLES IN SCHEMA billing TO tally_readonly;
    REVOKE SELECT ON billing.api_keys FROM tally_readonly;
    ALTER DEFAULT PRIVILEGES IN SCHEMA billing GRANT SELECT ON TABLES TO tally_readonly;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        ALTER DEFAULT PRIVILEGES IN SCHEMA billing REVOKE SELECT ON TABLES FROM tally_readonly;
        REVOKE SELECT ON ALL TABLES IN SCHEMA billing FROM tally_readonly;
        REVOKE USAGE ON SCHEMA billing FROM tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd
-- The role stays: other databases of the cluster may use it.
DROP VIEW billing.charge_adjustments;
DROP VIEW billing.charges_open;
DROP VIEW billing.reconciliation;
DROP INDEX billing.stripe_events_payment_intent_idx;
DROP VIEW billing.period_totals;
