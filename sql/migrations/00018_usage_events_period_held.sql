-- The single-event insert (usageEventInsertOpenSQL in internal/ledger) takes
-- its event's period row FOR KEY SHARE and inserts only from that row, in
-- the same statement: the period exists by construction, and the check per
-- statement of 00013 (a transition table, a PL/pgSQL call and an anti-join)
-- cost that statement a tenth of its throughput (docs/benchmarks.md). The
-- statement marks itself instead: it sets tally.event_period_held to its
-- transaction id and start time, and the check skips the statements that
-- carry that mark. Each statement Tally sends (extended protocol: Parse, Bind
-- and Execute each reset the start time) has a start time of its own, so
-- its batches, a later statement of the same transaction, and any insert
-- that does not set the mark are checked. Statements that share a start time
-- share the mark: several statements in one simple-protocol Query message
-- (psql -c "a; b", a pgx batch in simple_protocol mode) or inside one
-- function call. Tally sends the single-event statement alone; whoever sends
-- it together with another insert, or sets the mark by hand, skips the check
-- for that insert too. The mark is a guard against Tally's own mistakes, not
-- a privilege: a role that may insert events may insert any event anyway.

-- +goose Up
DROP TRIGGER usage_events_period_exists ON billing.usage_events;
CREATE TRIGGER usage_events_period_exists
    AFTER INSERT ON billing.usage_events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    WHEN (current_setting('tally.event_period_held', true) IS DISTINCT FROM
          pg_current_xact_id()::text || '@' || statement_timestamp()::text)
    EXECUTE FUNCTION billing.usage_events_period_exists();
COMMENT ON TRIGGER usage_events_period_exists ON billing.usage_events IS
    'Every event''s (customer_id, period) is a row of billing.periods: one check per statement, but for a statement that inserted from its period''s row, held FOR KEY SHARE, and said so (tally.event_period_held).';

-- +goose Down
DROP TRIGGER usage_events_period_exists ON billing.usage_events;
CREATE TRIGGER usage_events_period_exists
    AFTER INSERT ON billing.usage_events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION billing.usage_events_period_exists();
COMMENT ON TRIGGER usage_events_period_exists ON billing.usage_events IS
    'Every event''s (customer_id, period) is a row of billing.periods: one check per statement.';
