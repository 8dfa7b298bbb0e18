-- The statements that write single events (usageEventInsertOpenSQL and
-- usageEventsInsertOpenSQL in internal/ledger), as functions whose bodies are
-- those statements word for word (TestInsertFunctionsAreTheStatements). A
-- function's plan is cached by its server connection, whoever calls it: behind
-- a pooler in transaction mode (TALLY_POOLER_URL), where Tally prepares no
-- named statement and every statement is planned for its run, the hottest
-- statement of ingest is still planned once per connection, not once per
-- event or group (docs/scaling.md). Tally calls them directly and through a
-- pooler alike; batches keep the statement inline (planned for each batch,
-- a small share of a thousand rows).
--
-- Each body is one statement, the only one of its function call, so the mark
-- it sets (tally.event_period_held, migration 00018: its transaction and the
-- calling statement's start time) covers that insert alone.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION billing.usage_event_insert_open(
    text, text, text, bigint, text, text, text, jsonb, timestamptz, timestamptz, bytea)
RETURNS TABLE (id bigint, customer_id text, event_id text, period text, amount_cents bigint, currency text,
               quantity text, metric text, properties jsonb, occurred_at timestamptz, received_at timestamptz,
               payload_hash bytea)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH p AS MATERIALIZED (
  SELECT currency, status, closes_at, plan_id, plan_version,
         set_config('tally.event_period_held', pg_current_xact_id()::text || '@' || statement_timestamp()::text, true)
  FROM billing.periods
  WHERE customer_id = $1 AND period = $3
  FOR KEY SHARE
)
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, quantity,
                                  metric, properties, occurred_at, received_at, payload_hash)
SELECT $1, $2, $3, $4, p.currency, $6::text::numeric, $7, $8, $9, $10, $11 FROM p
WHERE p.status = 'open' AND p.closes_at > $10 AND ($5::text = '' OR $5::text = p.currency)
  AND ($6::text IS NULL OR EXISTS (SELECT 1 FROM billing.plan_prices pp
                                   WHERE pp.plan_id = p.plan_id AND pp.version = p.plan_version AND pp.metric = $7))
ON CONFLICT (customer_id, event_id) DO NOTHING
RETURNING id, customer_id, event_id, period, coalesce(amount_cents, 0), currency, quantity::text,
       metric, properties, occurred_at, received_at, payload_hash;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION billing.usage_events_insert_open(
    text[], text[], text[], bigint[], text[], text[], text[], text[], timestamptz[], timestamptz, bytea[])
RETURNS TABLE (customer_id text, event_id text, id bigint, currency text, properties jsonb)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH e AS MATERIALIZED (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[],
                       $8::text[], $9::timestamptz[], $11::bytea[])
       WITH ORDINALITY AS e (customer_id, event_id, period, amount_cents, currency, quantity, metric,
                             properties, occurred_at, payload_hash, n)
), p AS MATERIALIZED (
  SELECT p.customer_id, p.period, p.currency, p.status, p.closes_at, p.plan_id, p.plan_version,
         set_config('tally.event_period_held', pg_current_xact_id()::text || '@' || statement_timestamp()::text, true)
  FROM (SELECT customer_id, period FROM e GROUP BY customer_id, period ORDER BY customer_id COLLATE "C", period COLLATE "C") k
  CROSS JOIN LATERAL (SELECT * FROM billing.periods p
                      WHERE p.customer_id = k.customer_id AND p.period = k.period
                      FOR KEY SHARE) p
)
INSERT INTO billing.usage_events (customer_id, event_id, period, amount_cents, currency, quantity,
                                  metric, properties, occurred_at, received_at, payload_hash)
SELECT e.customer_id, e.event_id, e.period, e.amount_cents, p.currency, e.quantity::numeric, e.metric,
       e.properties::jsonb, e.occurred_at, $10, e.payload_hash
FROM e JOIN p ON p.customer_id = e.customer_id AND p.period = e.period
WHERE p.status = 'open' AND p.closes_at > $10 AND (e.currency = '' OR e.currency = p.currency)
  AND (e.quantity IS NULL OR EXISTS (SELECT 1 FROM billing.plan_prices pp
                                     WHERE pp.plan_id = p.plan_id AND pp.version = p.plan_version AND pp.metric = e.metric))
ORDER BY e.customer_id COLLATE "C", e.event_id COLLATE "C", e.n
ON CONFLICT (customer_id, event_id) DO NOTHING
RETURNING customer_id, event_id, id, currency, properties;
END;
$fn$;
-- +goose StatementEnd

COMMENT ON FUNCTION billing.usage_event_insert_open(text, text, text, bigint, text, text, text, jsonb, timestamptz, timestamptz, bytea) IS
    'One single event, inserted from its period''s row held FOR KEY SHARE: internal/ledger usageEventInsertOpenSQL, word for word.';
COMMENT ON FUNCTION billing.usage_events_insert_open(text[], text[], text[], bigint[], text[], text[], text[], text[], timestamptz[], timestamptz, bytea[]) IS
    'A group of single events, each inserted from its period''s row held FOR KEY SHARE: internal/ledger usageEventsInsertOpenSQL, word for word.';

-- +goose Down
DROP FUNCTION billing.usage_events_insert_open(text[], text[], text[], bigint[], text[], text[], text[], text[], timestamptz[], timestamptz, bytea[]);
DROP FUNCTION billing.usage_event_insert_open(text, text, text, bigint, text, text, text, jsonb, timestamptz, timestamptz, bytea);
