-- Charges: one row per (customer, period), the status machine of
-- docs/design.md (Charge states), the append-only log of every Stripe call,
-- and the log of every status change with who made it.

-- +goose Up
CREATE TABLE billing.charges (
    id                            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id                   text        NOT NULL,
    period                        text        NOT NULL,
    status                        text        NOT NULL CHECK (status IN (
        'pending', 'processing', 'unknown', 'held', 'succeeded', 'failed', 'skipped', 'canceled')),
    amount_cents                  bigint      NOT NULL CHECK (amount_cents >= 0),
    currency                      text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    event_count                   bigint      NOT NULL CHECK (event_count >= 0),
    stripe_customer_id            text        NOT NULL,
    stripe_payment_method_id      text,
    charge_key                    text        NOT NULL UNIQUE,
    idempotency_key               text        NOT NULL UNIQUE,
    key_generation                integer     NOT NULL DEFAULT 0 CHECK (key_generation >= 0),
    stripe_payment_intent_id      text        UNIQUE,
    stripe_charge_id              text,
    failure_code                  text,
    failure_message               text,
    held_reason                   text,
    resolved_by                   text,
    lease_owner                   text,
    lease_expires_at              timestamptz,
    attempt_count                 integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    first_attempted_at            timestamptz,
    generation_first_attempted_at timestamptz,
    last_attempted_at             timestamptz,
    created_at                    timestamptz NOT NULL,
    updated_at                    timestamptz NOT NULL,
    CONSTRAINT charges_customer_period_key UNIQUE (customer_id, period),
    FOREIGN KEY (customer_id, period) REFERENCES billing.periods (customer_id, period),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK (status <> 'succeeded' OR stripe_payment_intent_id IS NOT NULL),
    CHECK (status <> 'held' OR held_reason IS NOT NULL),
    CHECK (status <> 'skipped' OR amount_cents = 0)
);

COMMENT ON TABLE billing.charges IS
    'One charge per (customer, period). The pending row commits before money moves; the '
    'Stripe idempotency key is derived from (customer, period, key_generation).';
COMMENT ON COLUMN billing.charges.charge_key IS
    'hex(sha256("tally:charge:v1:" || customer_id || ":" || period)), sent as metadata.tally_charge_key; '
    'stable across key generations, used to find the charge''s PaymentIntents on Stripe.';
COMMENT ON COLUMN billing.charges.generation_first_attempted_at IS
    'First attempt with the current idempotency key; Stripe keeps a key for 24 h from its first use.';
COMMENT ON COLUMN billing.charges.resolved_by IS
    'What decided the current outcome: stripe_response, webhook:<event id>, reconcile, operator:<name>.';

CREATE INDEX charges_status_idx ON billing.charges (status, id);
CREATE INDEX charges_unresolved_idx ON billing.charges (last_attempted_at)
    WHERE status IN ('pending', 'unknown', 'processing');

CREATE TABLE billing.charge_attempts (
    id                       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    charge_id                bigint      NOT NULL REFERENCES billing.charges (id),
    attempt                  integer     NOT NULL,
    key_generation           integer     NOT NULL,
    idempotency_key          text        NOT NULL,
    lease_owner              text        NOT NULL,
    river_job_id             bigint,
    river_attempt            integer,
    started_at               timestamptz NOT NULL,
    finished_at              timestamptz,
    outcome                  text CHECK (outcome IN (
        'succeeded', 'processing', 'failed', 'unknown', 'retry_later', 'held', 'error')),
    http_status              integer,
    stripe_request_id        text,
    stripe_payment_intent_id text,
    error_type               text,
    error_code               text,
    error_message            text,
    UNIQUE (charge_id, attempt),
    CHECK ((finished_at IS NULL) = (outcome IS NULL))
);

COMMENT ON TABLE billing.charge_attempts IS
    'One row per Stripe call, written when the call starts; its result columns are filled once, '
    'when it finishes. A row never finished is a call whose worker died: its outcome is unknown.';

CREATE INDEX charge_attempts_charge_idx ON billing.charge_attempts (charge_id, id);

-- +goose StatementBegin
CREATE FUNCTION billing.charge_attempts_finish_once() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.finished_at IS NOT NULL
       OR NEW.charge_id IS DISTINCT FROM OLD.charge_id
       OR NEW.attempt IS DISTINCT FROM OLD.attempt
       OR NEW.key_generation IS DISTINCT FROM OLD.key_generation
       OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
       OR NEW.lease_owner IS DISTINCT FROM OLD.lease_owner
       OR NEW.started_at IS DISTINCT FROM OLD.started_at THEN
        RAISE EXCEPTION 'billing.charge_attempts is append-only: an attempt''s result is written once'
            USING ERRCODE = 'raise_exception';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER charge_attempts_finish_once
    BEFORE UPDATE ON billing.charge_attempts
    FOR EACH ROW EXECUTE FUNCTION billing.charge_attempts_finish_once();
CREATE TRIGGER charge_attempts_append_only
    BEFORE DELETE ON billing.charge_attempts
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER charge_attempts_no_truncate
    BEFORE TRUNCATE ON billing.charge_attempts
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

CREATE TABLE billing.charge_transitions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    charge_id   bigint      NOT NULL REFERENCES billing.charges (id),
    from_status text,
    to_status   text        NOT NULL,
    actor       text        NOT NULL,
    reason      text,
    created_at  timestamptz NOT NULL
);

COMMENT ON TABLE billing.charge_transitions IS
    'Every status change of a charge and who made it: job:<id>/<attempt>, webhook:<event id>, '
    'reconciler, operator:<name>. Append-only.';

CREATE INDEX charge_transitions_charge_idx ON billing.charge_transitions (charge_id, id);
CREATE TRIGGER charge_transitions_append_only
    BEFORE UPDATE OR DELETE ON billing.charge_transitions
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();

-- +goose Down
DROP TABLE billing.charge_transitions;
DROP TABLE billing.charge_attempts;
DROP FUNCTION billing.charge_attempts_finish_once();
DROP TABLE billing.charges;
