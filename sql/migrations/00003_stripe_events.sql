-- Stripe webhooks: every event stored by its Stripe id (status-keyed, so a
-- crash mid-processing is retried, never dropped), and refunds and disputes
-- as their own append-only rows.

-- +goose Up
CREATE TABLE billing.stripe_events (
    id           text        PRIMARY KEY,
    type         text        NOT NULL,
    payload      jsonb       NOT NULL,
    livemode     boolean     NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL,
    received_at  timestamptz NOT NULL,
    status       text        NOT NULL DEFAULT 'received'
        CHECK (status IN ('received', 'processed', 'ignored', 'failed')),
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    processed_at timestamptz,
    job_id       bigint,
    CHECK ((status IN ('processed', 'ignored')) = (processed_at IS NOT NULL))
);

COMMENT ON TABLE billing.stripe_events IS
    'Stripe webhook events by event id. received: stored, its job not done; processed or ignored: '
    'done; failed: the last processing attempt failed and River retries it.';

CREATE INDEX stripe_events_received_at_idx ON billing.stripe_events (received_at);
CREATE INDEX stripe_events_pending_idx ON billing.stripe_events (received_at) WHERE status IN ('received', 'failed');

CREATE TABLE billing.refunds (
    stripe_refund_id         text        PRIMARY KEY,
    charge_id                bigint      REFERENCES billing.charges (id),
    stripe_charge_id         text        NOT NULL,
    stripe_payment_intent_id text,
    amount_cents             bigint      NOT NULL CHECK (amount_cents > 0),
    currency                 text        NOT NULL,
    status                   text,
    reason                   text,
    stripe_created_at        timestamptz NOT NULL,
    recorded_at              timestamptz NOT NULL,
    stripe_event_id          text        NOT NULL
);

CREATE INDEX refunds_charge_idx ON billing.refunds (charge_id);
CREATE TRIGGER refunds_append_only
    BEFORE UPDATE OR DELETE ON billing.refunds
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();

CREATE TABLE billing.disputes (
    stripe_dispute_id        text        PRIMARY KEY,
    charge_id                bigint      REFERENCES billing.charges (id),
    stripe_charge_id         text        NOT NULL,
    stripe_payment_intent_id text,
    amount_cents             bigint      NOT NULL CHECK (amount_cents >= 0),
    currency                 text        NOT NULL,
    status                   text,
    reason                   text,
    stripe_created_at        timestamptz NOT NULL,
    recorded_at              timestamptz NOT NULL,
    stripe_event_id          text        NOT NULL
);

CREATE INDEX disputes_charge_idx ON billing.disputes (charge_id);
CREATE TRIGGER disputes_append_only
    BEFORE UPDATE OR DELETE ON billing.disputes
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();

CREATE INDEX charges_stripe_charge_idx ON billing.charges (stripe_charge_id);

-- +goose Down
DROP INDEX billing.charges_stripe_charge_idx;
DROP TABLE billing.disputes;
DROP TABLE billing.refunds;
DROP TABLE billing.stripe_events;
