-- Top-ups (GitHub issue 25): a customer buys credits with a PaymentIntent,
-- charged once on the same terms as a period's charge.
--
-- A top-up (billing.top_ups) is committed pending, with its River job, before
-- any money moves; its job leases the row (lease_owner, lease_expires_at),
-- looks on Stripe for a PaymentIntent carrying its key
-- (metadata.tally_top_up_key) before every call, and calls with an
-- idempotency key derived from (namespace, customer, top_up_id) and the key
-- generation. The grant
-- it buys (billing.credit_grants.top_up_id) is written in the transaction
-- that records the PaymentIntent's success, under the top-up's row lock:
-- one top-up, at most one grant.
--
-- Automatic recharge: a customer with recharge_below_cents and
-- recharge_to_cents gets one top-up (source recharge) when a close leaves
-- its balance below the threshold; recharge_armed is cleared by that
-- top-up and set again only when the balance is back at or above the
-- threshold, so one crossing starts one top-up, whatever the replicas.

-- +goose Up
CREATE TABLE billing.top_ups (
    id                       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id              text        NOT NULL REFERENCES billing.customers (customer_id),
    top_up_id                text        NOT NULL CHECK (octet_length(top_up_id) BETWEEN 1 AND 255),
    source                   text        NOT NULL CHECK (source IN ('api', 'recharge')),
    status                   text        NOT NULL CHECK (status IN (
        'pending', 'processing', 'unknown', 'succeeded', 'failed', 'held', 'canceled')),
    amount_cents             bigint      NOT NULL CHECK (amount_cents > 0),
    currency                 text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    category                 text        NOT NULL CHECK (category IN ('paid', 'promotional')),
    priority                 integer     NOT NULL CHECK (priority BETWEEN 0 AND 1000),
    grant_expires_at         timestamptz,
    stripe_customer_id       text        NOT NULL,
    stripe_payment_method_id text,
    top_up_key               text        NOT NULL UNIQUE,
    key_namespace            text        NOT NULL,
    key_generation           integer     NOT NULL DEFAULT 0 CHECK (key_generation >= 0),
    generation_first_attempted_at timestamptz,
    stripe_payment_intent_id text        UNIQUE,
    stripe_charge_id         text,
    failure_code             text,
    failure_message          text,
    held_reason              text,
    resolved_by              text,
    lease_owner              text,
    lease_expires_at         timestamptz,
    attempt_count            integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    first_attempted_at       timestamptz,
    last_attempted_at        timestamptz,
    job_id                   bigint,
    created_at               timestamptz NOT NULL,
    created_by               text        NOT NULL CHECK (created_by <> ''),
    updated_at               timestamptz NOT NULL,
    canceled_by              text,
    cancel_reason            text        CHECK (char_length(cancel_reason) BETWEEN 1 AND 1000),
    UNIQUE (customer_id, top_up_id),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK (status <> 'succeeded' OR stripe_payment_intent_id IS NOT NULL),
    CHECK (status <> 'held' OR held_reason IS NOT NULL),
    CHECK (status <> 'canceled' OR (canceled_by IS NOT NULL AND cancel_reason IS NOT NULL))
);

COMMENT ON TABLE billing.top_ups IS
    'Credits bought with a PaymentIntent, one row per (customer, top_up_id), committed pending before money moves. '
    'A succeeded top-up has exactly one grant (billing.credit_grants.top_up_id).';
COMMENT ON COLUMN billing.top_ups.source IS
    'api (POST /v1/customers/{id}/top-ups) or recharge (the customer''s automatic recharge, started by a close).';
COMMENT ON COLUMN billing.top_ups.top_up_key IS
    'hex(sha256("tally:topup:v1:" || namespace || ":" || customer_id || ":" || top_up_id)): the Stripe idempotency '
    'key of every create of the top-up''s PaymentIntent, and its metadata.tally_top_up_key, by which a look-up '
    'finds it on Stripe.';
COMMENT ON COLUMN billing.top_ups.key_generation IS
    'The idempotency key of a call is top_up_key for generation 0, else hex(sha256(the key''s string || ":" || '
    'generation)); a claim moves to the next generation once Stripe may have forgotten the current one (24 h after '
    'its first call), and the look-up before every call finds a PaymentIntent of any generation.';
COMMENT ON COLUMN billing.top_ups.resolved_by IS
    'What decided the current outcome: stripe_response, lookup, webhook:<event id>, operator:<name>.';

CREATE INDEX top_ups_open_idx ON billing.top_ups (updated_at)
    WHERE status IN ('pending', 'unknown', 'processing');

CREATE TABLE billing.top_up_transitions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    top_up      bigint      NOT NULL REFERENCES billing.top_ups (id),
    from_status text,
    to_status   text        NOT NULL,
    reason      text,
    actor       text        NOT NULL,
    created_at  timestamptz NOT NULL
);

CREATE INDEX top_up_transitions_top_up_idx ON billing.top_up_transitions (top_up, id);

COMMENT ON TABLE billing.top_up_transitions IS
    'Every status a top-up took, who moved it and why; append-only.';

CREATE TRIGGER top_up_transitions_append_only
    BEFORE UPDATE OR DELETE ON billing.top_up_transitions
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER top_up_transitions_no_truncate
    BEFORE TRUNCATE ON billing.top_up_transitions
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

ALTER TABLE billing.credit_grants ADD COLUMN top_up_id bigint UNIQUE REFERENCES billing.top_ups (id);
COMMENT ON COLUMN billing.credit_grants.top_up_id IS
    'The top-up that bought the grant (its PaymentIntent succeeded); null for a grant given by an operator.';

ALTER TABLE billing.customers
    ADD COLUMN recharge_below_cents bigint CHECK (recharge_below_cents > 0),
    ADD COLUMN recharge_to_cents    bigint,
    ADD COLUMN recharge_armed       boolean NOT NULL DEFAULT true,
    ADD COLUMN recharge_count       integer NOT NULL DEFAULT 0 CHECK (recharge_count >= 0),
    ADD CONSTRAINT customers_recharge_check CHECK (
        (recharge_below_cents IS NULL) = (recharge_to_cents IS NULL) AND recharge_to_cents > recharge_below_cents);
COMMENT ON COLUMN billing.customers.recharge_below_cents IS
    'Automatic recharge: when a close leaves the customer''s credit balance (its currency) below this, one top-up '
    'brings it to recharge_to_cents.';
COMMENT ON COLUMN billing.customers.recharge_armed IS
    'Cleared when a recharge starts; set again when the balance is back at or above recharge_below_cents: one '
    'top-up per crossing.';

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        GRANT SELECT ON billing.top_ups, billing.top_up_transitions TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE billing.customers DROP CONSTRAINT customers_recharge_check,
    DROP COLUMN recharge_below_cents, DROP COLUMN recharge_to_cents, DROP COLUMN recharge_armed,
    DROP COLUMN recharge_count;
ALTER TABLE billing.credit_grants DROP COLUMN top_up_id;
DROP TABLE billing.top_up_transitions;
DROP TABLE billing.top_ups;
