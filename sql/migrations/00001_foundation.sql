-- Foundation: customers, billing periods, the append-only usage ledger and
-- API keys. Every table lives in schema billing (created by cmd/migrate
-- before goose runs, because goose's own version table lives there too).

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION billing.reject_mutation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'billing.% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'raise_exception', HINT = 'record a correcting row instead';
END;
$$;
-- +goose StatementEnd

CREATE TABLE billing.customers (
    customer_id              text        PRIMARY KEY
        CHECK (octet_length(customer_id) BETWEEN 1 AND 255),
    stripe_customer_id       text        NOT NULL
        CHECK (octet_length(stripe_customer_id) BETWEEN 1 AND 255),
    stripe_payment_method_id text
        CHECK (octet_length(stripe_payment_method_id) BETWEEN 1 AND 255),
    currency                 text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    max_charge_cents         bigint      CHECK (max_charge_cents > 0),
    created_at               timestamptz NOT NULL,
    updated_at               timestamptz NOT NULL
);

COMMENT ON TABLE billing.customers IS
    'Billable customers keyed by the producer''s own id; currency is ISO 4217 lower-case.';

CREATE TABLE billing.periods (
    customer_id   text        NOT NULL REFERENCES billing.customers (customer_id),
    period        text        NOT NULL CHECK (octet_length(period) BETWEEN 1 AND 32),
    currency      text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    starts_at     timestamptz NOT NULL,
    ends_at       timestamptz NOT NULL,
    closes_at     timestamptz NOT NULL,
    status        text        NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    closed_at     timestamptz,
    charge_job_id bigint,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (customer_id, period),
    CHECK (starts_at < ends_at AND ends_at <= closes_at),
    CHECK ((status = 'closed') = (closed_at IS NOT NULL))
);

COMMENT ON TABLE billing.periods IS
    'One row per (customer, billing period). Ingest holds FOR KEY SHARE on the row while it '
    'writes an event; closing takes FOR UPDATE, so no committed event can miss its charge.';
COMMENT ON COLUMN billing.periods.charge_job_id IS
    'id of the river.river_job row (kind charge_period) inserted with this row.';

CREATE INDEX periods_open_closes_at_idx ON billing.periods (closes_at) WHERE status = 'open';

CREATE TABLE billing.usage_events (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id  text        NOT NULL,
    event_id     text        NOT NULL CHECK (octet_length(event_id) BETWEEN 1 AND 255),
    period       text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0 AND amount_cents <= 1000000000000),
    currency     text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    quantity     bigint      CHECK (quantity >= 0),
    metric       text        CHECK (octet_length(metric) <= 255),
    properties   jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(properties) = 'object'),
    occurred_at  timestamptz NOT NULL,
    received_at  timestamptz NOT NULL,
    payload_hash bytea       NOT NULL CHECK (octet_length(payload_hash) = 32),
    CONSTRAINT usage_events_customer_event_key UNIQUE (customer_id, event_id),
    FOREIGN KEY (customer_id, period) REFERENCES billing.periods (customer_id, period)
);

COMMENT ON TABLE billing.usage_events IS
    'Append-only usage ledger: one row per acknowledged event; UPDATE, DELETE and TRUNCATE are rejected.';
COMMENT ON COLUMN billing.usage_events.payload_hash IS
    'SHA-256 of the canonical request payload; a re-post with the same event_id must match it.';

-- Sums per period are index-only scans.
CREATE INDEX usage_events_period_idx ON billing.usage_events (customer_id, period) INCLUDE (amount_cents);

CREATE TRIGGER usage_events_append_only
    BEFORE UPDATE OR DELETE ON billing.usage_events
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER usage_events_no_truncate
    BEFORE TRUNCATE ON billing.usage_events
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

CREATE TABLE billing.api_keys (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text        NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 255),
    key_prefix    text        NOT NULL UNIQUE,
    secret_sha256 bytea       NOT NULL UNIQUE CHECK (octet_length(secret_sha256) = 32),
    scopes        text[]      NOT NULL CHECK (
        cardinality(scopes) > 0
        AND scopes <@ ARRAY['usage:write', 'customers:write', 'billing:read', 'admin']::text[]),
    created_at    timestamptz NOT NULL,
    revoked_at    timestamptz,
    last_used_at  timestamptz
);

COMMENT ON TABLE billing.api_keys IS
    'API keys: only the SHA-256 of the secret is stored; the secret is shown once at creation.';

-- +goose Down
DROP TABLE billing.api_keys;
DROP TABLE billing.usage_events;
DROP TABLE billing.periods;
DROP TABLE billing.customers;
DROP FUNCTION billing.reject_mutation();
