-- A ledger that outgrows one table (GitHub issue 27): billing.usage_events
-- becomes PARTITION BY HASH (customer_id), 16 partitions
-- billing.usage_events_p00 to _p15 (MODULUS 16). Not by period: a unique
-- key of a partitioned table must hold the partition key, so partitions by
-- period would put period in (customer_id, event_id), and an event_id would
-- be idempotent within a period only, not across periods as it is. By hash
-- of customer_id the key stays what it is; every statement of the hot path
-- names its customer_id (ingest, the single-event statements, the close's
-- sums, a void, the period check), so each is pruned to one partition; and
-- it is the key a later distribution of the schema by customer would use
-- (docs/scaling.md).
--
-- What stays as it was, under the same names:
--   - the columns, their defaults, the identity of id (its sequence carries
--     on from the old one's value, so no id is handed out twice: ids are the
--     roll-up watermark's cursor), the CHECK constraints (the one added NOT
--     VALID by 00024 still is, and is added after the copy: events from
--     before 00024 may break it);
--   - usage_events_customer_event_key UNIQUE (customer_id, event_id), the
--     target of every ON CONFLICT, and the foreign key of
--     billing.usage_event_voids to it;
--   - usage_events_period_idx (customer_id, period) INCLUDE (amount_cents);
--   - the triggers: usage_events_append_only (a row trigger, which Postgres
--     clones onto every partition), usage_events_no_truncate and the period
--     check usage_events_period_exists (statement triggers, which fire for
--     the table a statement names only: so they are on the partitioned table
--     and on each partition too, and an insert into, or a TRUNCATE of, one
--     partition is checked or refused as well; a statement on the partitioned
--     table fires its own once, not the partitions');
--   - the comments and the grants of the table, and billing.usage_events_counted
--     (replaced with its own definition, 00025's, now on the new table: the
--     views built on it keep theirs, their grants and comments).
--
-- What changes: the primary key is (id, customer_id), not (id): a primary
-- key of a partitioned table must hold the partition key. id leads it, so
-- the statements that read by id alone (the roll-up's range of new ids,
-- max(id)) still read an index, one per partition. ids stay unique by
-- their sequence (GENERATED ALWAYS): no index holds them unique across
-- partitions any more. A unique violation of the event key names the
-- partition's index, usage_events_pNN_customer_event_key (internal/ledger
-- reads both names). A row trigger that refuses an UPDATE or DELETE names
-- the partition it fires on (billing.usage_events_p07 is append-only). A
-- partition has no identity of its own (Postgres 15): an insert into one
-- directly must give the id; Tally inserts into billing.usage_events. A
-- statement that reads the events of many periods in a loop is planned as
-- if each loop read every partition (docs/scaling.md: JIT).
--
-- How: the old table is renamed out of the way, the partitioned table is
-- created under the old name and the rows copied into it, ids kept
-- (OVERRIDING SYSTEM VALUE); its keys and index are built after the copy,
-- its triggers added after it (the rows copied were checked when they were
-- inserted), then the old table is dropped. It all holds the table's
-- exclusive lock in one transaction: ingest waits for the migration, for a
-- time that grows with the ledger (9-17 s, 12 s median, for a million
-- events on two busy cores, docs/scaling.md; plan it for a quiet hour on a
-- large ledger).
-- Autovacuum analyzes the partitions, never a partitioned table: run
-- ANALYZE billing.usage_events after it, and now and then (it is left out
-- of the migration, which it would make a third longer).
-- Down makes it one table again the same way.

-- +goose Up
LOCK TABLE billing.usage_events IN ACCESS EXCLUSIVE MODE;

ALTER TABLE billing.usage_events RENAME TO usage_events_unpartitioned;
ALTER INDEX billing.usage_events_pkey RENAME TO usage_events_unpartitioned_pkey;
ALTER INDEX billing.usage_events_customer_event_key RENAME TO usage_events_unpartitioned_customer_event_key;
ALTER INDEX billing.usage_events_period_idx RENAME TO usage_events_unpartitioned_period_idx;
ALTER SEQUENCE billing.usage_events_id_seq RENAME TO usage_events_unpartitioned_id_seq;

CREATE TABLE billing.usage_events (
    id           bigint      GENERATED ALWAYS AS IDENTITY,
    customer_id  text        NOT NULL,
    event_id     text        NOT NULL
        CONSTRAINT usage_events_event_id_check CHECK (octet_length(event_id) BETWEEN 1 AND 255),
    period       text        NOT NULL,
    amount_cents bigint
        CONSTRAINT usage_events_amount_cents_check CHECK (amount_cents > 0 AND amount_cents <= 1000000000000),
    currency     text        NOT NULL CONSTRAINT usage_events_currency_check CHECK (currency ~ '^[a-z]{3}$'),
    quantity     numeric
        CONSTRAINT usage_events_quantity_check CHECK (quantity >= 0 AND quantity < 1e20 AND scale(quantity) <= 12),
    metric       text        CONSTRAINT usage_events_metric_check CHECK (octet_length(metric) <= 255),
    properties   jsonb       NOT NULL DEFAULT '{}'::jsonb
        CONSTRAINT usage_events_properties_check CHECK (jsonb_typeof(properties) = 'object'),
    occurred_at  timestamptz NOT NULL,
    received_at  timestamptz NOT NULL,
    payload_hash bytea       NOT NULL CONSTRAINT usage_events_payload_hash_check CHECK (octet_length(payload_hash) = 32),
    CONSTRAINT usage_events_priced
        CHECK (amount_cents IS NOT NULL OR (quantity IS NOT NULL AND metric IS NOT NULL))
) PARTITION BY HASH (customer_id);

-- +goose StatementBegin
DO $$
BEGIN
    FOR r IN 0..15 LOOP
        EXECUTE format('CREATE TABLE billing.%I PARTITION OF billing.usage_events FOR VALUES WITH (MODULUS 16, REMAINDER %s)',
                       format('usage_events_p%s', to_char(r, 'FM00')), r);
        EXECUTE format('COMMENT ON TABLE billing.%I IS %L', format('usage_events_p%s', to_char(r, 'FM00')),
                       format('Partition %s of 16 of billing.usage_events (hash of customer_id): read and write billing.usage_events.', r));
    END LOOP;
END
$$;
-- +goose StatementEnd

INSERT INTO billing.usage_events (id, customer_id, event_id, period, amount_cents, currency, quantity, metric,
                                  properties, occurred_at, received_at, payload_hash)
OVERRIDING SYSTEM VALUE
SELECT id, customer_id, event_id, period, amount_cents, currency, quantity, metric,
       properties, occurred_at, received_at, payload_hash
FROM billing.usage_events_unpartitioned;

-- The identity carries on where the old one was (not at max(id): ids taken
-- by transactions rolled back were handed out too).
SELECT setval(pg_get_serial_sequence('billing.usage_events', 'id'), s.last_value, s.is_called)
FROM billing.usage_events_unpartitioned_id_seq s;

ALTER TABLE billing.usage_events
    ADD CONSTRAINT usage_events_pkey PRIMARY KEY (id, customer_id),
    ADD CONSTRAINT usage_events_customer_event_key UNIQUE (customer_id, event_id);
CREATE INDEX usage_events_period_idx ON billing.usage_events (customer_id, period) INCLUDE (amount_cents);
ALTER TABLE billing.usage_events ADD CONSTRAINT usage_events_amount_or_quantity
    CHECK (amount_cents IS NULL OR quantity IS NULL) NOT VALID;

-- Each partition's indexes by its name and the index's: usage_events_p00_pkey,
-- usage_events_p00_customer_event_key, usage_events_p00_period_idx.
-- +goose StatementBegin
DO $$
DECLARE
    i record;
BEGIN
    FOR i IN
        SELECT ci.relname AS index, ct.relname AS partition, substr(parent.relname, length('usage_events_') + 1) AS suffix
        FROM pg_inherits h
        JOIN pg_class parent ON parent.oid = h.inhparent
        JOIN pg_class ci ON ci.oid = h.inhrelid
        JOIN pg_index x ON x.indexrelid = ci.oid
        JOIN pg_class ct ON ct.oid = x.indrelid
        WHERE h.inhparent IN ('billing.usage_events_pkey'::regclass, 'billing.usage_events_customer_event_key'::regclass,
                              'billing.usage_events_period_idx'::regclass)
    LOOP
        IF i.index <> i.partition || '_' || i.suffix THEN
            EXECUTE format('ALTER INDEX billing.%I RENAME TO %I', i.index, i.partition || '_' || i.suffix);
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

ALTER TABLE billing.usage_event_voids
    DROP CONSTRAINT usage_event_voids_customer_id_event_id_fkey,
    ADD CONSTRAINT usage_event_voids_customer_id_event_id_fkey
        FOREIGN KEY (customer_id, event_id) REFERENCES billing.usage_events (customer_id, event_id);

CREATE OR REPLACE VIEW billing.usage_events_counted AS
SELECT e.id, e.customer_id, e.event_id, e.period, e.amount_cents, e.currency, e.quantity, e.metric, e.properties,
       e.occurred_at, e.received_at
FROM billing.usage_events e
WHERE NOT EXISTS (SELECT 1 FROM billing.usage_event_voids v WHERE v.customer_id = e.customer_id AND v.event_id = e.event_id);

CREATE TRIGGER usage_events_append_only
    BEFORE UPDATE OR DELETE ON billing.usage_events
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();

-- +goose StatementBegin
DO $$
DECLARE
    rel text;
BEGIN
    FOR rel IN SELECT 'usage_events' UNION ALL SELECT format('usage_events_p%s', to_char(r, 'FM00')) FROM generate_series(0, 15) r LOOP
        EXECUTE format($t$
CREATE TRIGGER usage_events_no_truncate
    BEFORE TRUNCATE ON billing.%1$I
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER usage_events_period_exists
    AFTER INSERT ON billing.%1$I
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    WHEN (current_setting('tally.event_period_held', true) IS DISTINCT FROM
          pg_current_xact_id()::text || '@' || statement_timestamp()::text)
    EXECUTE FUNCTION billing.usage_events_period_exists();$t$, rel);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- The comments (the table's, its columns', its triggers') and the grants of
-- the old table, as they are.
-- +goose StatementBegin
DO $$
DECLARE
    old regclass := 'billing.usage_events_unpartitioned';
    c record;
BEGIN
    FOR c IN
        SELECT format('COMMENT ON TABLE billing.usage_events IS %L', d.description) AS stmt
        FROM pg_description d WHERE d.classoid = 'pg_class'::regclass AND d.objoid = old AND d.objsubid = 0
        UNION ALL
        SELECT format('COMMENT ON COLUMN billing.usage_events.%I IS %L', a.attname, d.description)
        FROM pg_description d JOIN pg_attribute a ON a.attrelid = d.objoid AND a.attnum = d.objsubid
        WHERE d.classoid = 'pg_class'::regclass AND d.objoid = old AND d.objsubid > 0
        UNION ALL
        SELECT format('COMMENT ON TRIGGER %I ON billing.%I IS %L', t.tgname, p.relname, d.description)
        FROM pg_trigger t JOIN pg_description d ON d.classoid = 'pg_trigger'::regclass AND d.objoid = t.oid
        CROSS JOIN (SELECT 'usage_events' UNION ALL SELECT format('usage_events_p%s', to_char(r, 'FM00'))
                    FROM generate_series(0, 15) r) p (relname)
        WHERE t.tgrelid = old
        UNION ALL
        SELECT format('GRANT %s ON billing.usage_events TO %s%s', a.privilege_type,
                      CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                      CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
        FROM pg_class t CROSS JOIN aclexplode(t.relacl) a
        WHERE t.oid = old AND a.grantee <> t.relowner
        UNION ALL
        SELECT format('GRANT %s (%I) ON billing.usage_events TO %s%s', a.privilege_type, att.attname,
                      CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                      CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
        FROM pg_attribute att CROSS JOIN aclexplode(att.attacl) a
        WHERE att.attrelid = old AND att.attnum > 0 AND NOT att.attisdropped
    LOOP
        EXECUTE c.stmt;
    END LOOP;
END
$$;
-- +goose StatementEnd

DROP TABLE billing.usage_events_unpartitioned;

-- +goose Down
LOCK TABLE billing.usage_events IN ACCESS EXCLUSIVE MODE;

ALTER TABLE billing.usage_events RENAME TO usage_events_partitioned;
ALTER INDEX billing.usage_events_pkey RENAME TO usage_events_partitioned_pkey;
ALTER INDEX billing.usage_events_customer_event_key RENAME TO usage_events_partitioned_customer_event_key;
ALTER INDEX billing.usage_events_period_idx RENAME TO usage_events_partitioned_period_idx;
ALTER SEQUENCE billing.usage_events_id_seq RENAME TO usage_events_partitioned_id_seq;

CREATE TABLE billing.usage_events (
    id           bigint      GENERATED ALWAYS AS IDENTITY,
    customer_id  text        NOT NULL,
    event_id     text        NOT NULL
        CONSTRAINT usage_events_event_id_check CHECK (octet_length(event_id) BETWEEN 1 AND 255),
    period       text        NOT NULL,
    amount_cents bigint
        CONSTRAINT usage_events_amount_cents_check CHECK (amount_cents > 0 AND amount_cents <= 1000000000000),
    currency     text        NOT NULL CONSTRAINT usage_events_currency_check CHECK (currency ~ '^[a-z]{3}$'),
    quantity     numeric
        CONSTRAINT usage_events_quantity_check CHECK (quantity >= 0 AND quantity < 1e20 AND scale(quantity) <= 12),
    metric       text        CONSTRAINT usage_events_metric_check CHECK (octet_length(metric) <= 255),
    properties   jsonb       NOT NULL DEFAULT '{}'::jsonb
        CONSTRAINT usage_events_properties_check CHECK (jsonb_typeof(properties) = 'object'),
    occurred_at  timestamptz NOT NULL,
    received_at  timestamptz NOT NULL,
    payload_hash bytea       NOT NULL CONSTRAINT usage_events_payload_hash_check CHECK (octet_length(payload_hash) = 32),
    CONSTRAINT usage_events_priced
        CHECK (amount_cents IS NOT NULL OR (quantity IS NOT NULL AND metric IS NOT NULL))
);

INSERT INTO billing.usage_events (id, customer_id, event_id, period, amount_cents, currency, quantity, metric,
                                  properties, occurred_at, received_at, payload_hash)
OVERRIDING SYSTEM VALUE
SELECT id, customer_id, event_id, period, amount_cents, currency, quantity, metric,
       properties, occurred_at, received_at, payload_hash
FROM billing.usage_events_partitioned;

SELECT setval(pg_get_serial_sequence('billing.usage_events', 'id'), s.last_value, s.is_called)
FROM billing.usage_events_partitioned_id_seq s;

ALTER TABLE billing.usage_events
    ADD CONSTRAINT usage_events_pkey PRIMARY KEY (id),
    ADD CONSTRAINT usage_events_customer_event_key UNIQUE (customer_id, event_id);
CREATE INDEX usage_events_period_idx ON billing.usage_events (customer_id, period) INCLUDE (amount_cents);
ALTER TABLE billing.usage_events ADD CONSTRAINT usage_events_amount_or_quantity
    CHECK (amount_cents IS NULL OR quantity IS NULL) NOT VALID;

ALTER TABLE billing.usage_event_voids
    DROP CONSTRAINT usage_event_voids_customer_id_event_id_fkey,
    ADD CONSTRAINT usage_event_voids_customer_id_event_id_fkey
        FOREIGN KEY (customer_id, event_id) REFERENCES billing.usage_events (customer_id, event_id);

CREATE OR REPLACE VIEW billing.usage_events_counted AS
SELECT e.id, e.customer_id, e.event_id, e.period, e.amount_cents, e.currency, e.quantity, e.metric, e.properties,
       e.occurred_at, e.received_at
FROM billing.usage_events e
WHERE NOT EXISTS (SELECT 1 FROM billing.usage_event_voids v WHERE v.customer_id = e.customer_id AND v.event_id = e.event_id);

CREATE TRIGGER usage_events_append_only
    BEFORE UPDATE OR DELETE ON billing.usage_events
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER usage_events_no_truncate
    BEFORE TRUNCATE ON billing.usage_events
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER usage_events_period_exists
    AFTER INSERT ON billing.usage_events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    WHEN (current_setting('tally.event_period_held', true) IS DISTINCT FROM
          pg_current_xact_id()::text || '@' || statement_timestamp()::text)
    EXECUTE FUNCTION billing.usage_events_period_exists();

-- +goose StatementBegin
DO $$
DECLARE
    old regclass := 'billing.usage_events_partitioned';
    c record;
BEGIN
    FOR c IN
        SELECT format('COMMENT ON TABLE billing.usage_events IS %L', d.description) AS stmt
        FROM pg_description d WHERE d.classoid = 'pg_class'::regclass AND d.objoid = old AND d.objsubid = 0
        UNION ALL
        SELECT format('COMMENT ON COLUMN billing.usage_events.%I IS %L', a.attname, d.description)
        FROM pg_description d JOIN pg_attribute a ON a.attrelid = d.objoid AND a.attnum = d.objsubid
        WHERE d.classoid = 'pg_class'::regclass AND d.objoid = old AND d.objsubid > 0
        UNION ALL
        SELECT format('COMMENT ON TRIGGER %I ON billing.usage_events IS %L', t.tgname, d.description)
        FROM pg_trigger t JOIN pg_description d ON d.classoid = 'pg_trigger'::regclass AND d.objoid = t.oid
        WHERE t.tgrelid = old
        UNION ALL
        SELECT format('GRANT %s ON billing.usage_events TO %s%s', a.privilege_type,
                      CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                      CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
        FROM pg_class t CROSS JOIN aclexplode(t.relacl) a
        WHERE t.oid = old AND a.grantee <> t.relowner
        UNION ALL
        SELECT format('GRANT %s (%I) ON billing.usage_events TO %s%s', a.privilege_type, att.attname,
                      CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                      CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
        FROM pg_attribute att CROSS JOIN aclexplode(att.attacl) a
        WHERE att.attrelid = old AND att.attnum > 0 AND NOT att.attisdropped
    LOOP
        EXECUTE c.stmt;
    END LOOP;
END
$$;
-- +goose StatementEnd

DROP TABLE billing.usage_events_partitioned;
