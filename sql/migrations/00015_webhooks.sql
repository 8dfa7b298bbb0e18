-- Outbound webhooks (GitHub issue 14): Tally tells the producer what happened
-- to its customers' charges and periods.
--
-- webhook_endpoints: where to send, which event types, and the secrets that
-- sign (the previous one keeps signing until previous_secret_until after a
-- rotation). An endpoint that failed a delivery's every attempt (days) with
-- no success since is disabled (disabled_at) until an operator enables it.
-- Deleting an endpoint marks it deleted_at: its log stays.
-- notifications: one row per event, written in the transaction of the change
-- it reports (the outbox), with the exact body sent; its id is what a
-- receiver drops duplicates by.
-- webhook_deliveries: one per (notification, endpoint subscribed when the
-- notification was written), each with its River job.
-- webhook_attempts: every try of a delivery (append-only).

-- +goose Up
CREATE TABLE billing.webhook_endpoints (
    id                    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url                   text        NOT NULL,
    events                text[]      NOT NULL CHECK (cardinality(events) > 0),
    description           text        NOT NULL DEFAULT '',
    secret                text        NOT NULL,
    previous_secret       text,
    previous_secret_until timestamptz,
    disabled_at           timestamptz,
    disabled_reason       text,
    deleted_at            timestamptz,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    CHECK ((previous_secret IS NULL) = (previous_secret_until IS NULL))
);

CREATE TABLE billing.notifications (
    id         text        PRIMARY KEY,
    type       text        NOT NULL,
    body       jsonb       NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX notifications_created_idx ON billing.notifications (created_at);

CREATE TABLE billing.webhook_deliveries (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    notification_id text        NOT NULL REFERENCES billing.notifications (id),
    endpoint_id     bigint      NOT NULL REFERENCES billing.webhook_endpoints (id),
    status          text        NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'delivered', 'failed', 'canceled')),
    attempt_count   integer     NOT NULL DEFAULT 0,
    last_attempt_at timestamptz,
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    UNIQUE (notification_id, endpoint_id)
);
CREATE INDEX webhook_deliveries_endpoint_idx ON billing.webhook_deliveries (endpoint_id, created_at);

CREATE TABLE billing.webhook_attempts (
    delivery_id      bigint      NOT NULL REFERENCES billing.webhook_deliveries (id),
    attempt          integer     NOT NULL,
    started_at       timestamptz NOT NULL,
    latency_ms       integer     NOT NULL,
    status_code      integer,
    error            text,
    response_excerpt text,
    PRIMARY KEY (delivery_id, attempt)
);

-- +goose Down
DROP TABLE billing.webhook_attempts;
DROP TABLE billing.webhook_deliveries;
DROP TABLE billing.notifications;
DROP TABLE billing.webhook_endpoints;
