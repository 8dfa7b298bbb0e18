-- Charges and what hangs off them in the shape a sharded Postgres (Citus)
-- requires of a table distributed by customer_id (docs/scaling.md,
-- "Distributed by customer_id (Citus): a plan"; TestCitusShape), the last
-- step after migrations 00032 and 00033: a charge's attempts, transitions,
-- lines and statement, its refunds and disputes and their events name the
-- charge's customer, filled from the charge for the rows written before;
-- every key includes customer_id and every foreign key among them pairs it.
-- The operators' log, which stays on the coordinator, no longer has a
-- foreign key to the charges (a charge is never deleted).
--
-- Key columns stay first, so a look-up by id, charge, key or Stripe id
-- descends the same index. charge_key and idempotency_key are derived from
-- the customer, ids come from sequences, and a statement's number from the
-- one counter row: nothing is lost there. Two guards are weaker: a
-- PaymentIntent id, and a Stripe refund or dispute id, are unique per
-- customer, no longer across customers. A PaymentIntent is recorded only on
-- the charge whose key it carries (the charge's own call, or a webhook or
-- look-up matched by its metadata charge_key), and a refund or dispute on
-- the charge its Stripe charge or PaymentIntent paid, then found by its id:
-- two customers' charges cannot be given the same one.

-- +goose Up
ALTER TABLE billing.charge_attempts ADD COLUMN customer_id text;
ALTER TABLE billing.charge_transitions ADD COLUMN customer_id text;
ALTER TABLE billing.charge_lines ADD COLUMN customer_id text;
ALTER TABLE billing.statements ADD COLUMN customer_id text;
ALTER TABLE billing.refunds ADD COLUMN customer_id text;
ALTER TABLE billing.disputes ADD COLUMN customer_id text;
ALTER TABLE billing.refund_events ADD COLUMN customer_id text;
ALTER TABLE billing.dispute_events ADD COLUMN customer_id text;

ALTER TABLE billing.charge_attempts DISABLE TRIGGER USER;
ALTER TABLE billing.charge_transitions DISABLE TRIGGER USER;
ALTER TABLE billing.charge_lines DISABLE TRIGGER USER;
ALTER TABLE billing.statements DISABLE TRIGGER USER;
ALTER TABLE billing.refunds DISABLE TRIGGER USER;
ALTER TABLE billing.disputes DISABLE TRIGGER USER;
ALTER TABLE billing.refund_events DISABLE TRIGGER USER;
ALTER TABLE billing.dispute_events DISABLE TRIGGER USER;
UPDATE billing.charge_attempts x SET customer_id = c.customer_id FROM billing.charges c WHERE c.id = x.charge_id;
UPDATE billing.charge_transitions x SET customer_id = c.customer_id FROM billing.charges c WHERE c.id = x.charge_id;
UPDATE billing.charge_lines x SET customer_id = c.customer_id FROM billing.charges c WHERE c.id = x.charge_id;
UPDATE billing.statements x SET customer_id = c.customer_id FROM billing.charges c WHERE c.id = x.charge_id;
-- A refund or dispute is recorded with the charge its Stripe charge or
-- PaymentIntent paid; one without (none is written so any more) is given
-- that charge's customer too.
UPDATE billing.refunds x SET customer_id = c.customer_id FROM billing.charges c
WHERE c.id = x.charge_id
   OR (x.charge_id IS NULL AND (c.stripe_charge_id = x.stripe_charge_id OR c.stripe_payment_intent_id = x.stripe_payment_intent_id));
UPDATE billing.disputes x SET customer_id = c.customer_id FROM billing.charges c
WHERE c.id = x.charge_id
   OR (x.charge_id IS NULL AND (c.stripe_charge_id = x.stripe_charge_id OR c.stripe_payment_intent_id = x.stripe_payment_intent_id));
UPDATE billing.refund_events x SET customer_id = r.customer_id FROM billing.refunds r WHERE r.stripe_refund_id = x.stripe_refund_id;
UPDATE billing.dispute_events x SET customer_id = d.customer_id FROM billing.disputes d WHERE d.stripe_dispute_id = x.stripe_dispute_id;
ALTER TABLE billing.charge_attempts ENABLE TRIGGER USER;
ALTER TABLE billing.charge_transitions ENABLE TRIGGER USER;
ALTER TABLE billing.charge_lines ENABLE TRIGGER USER;
ALTER TABLE billing.statements ENABLE TRIGGER USER;
ALTER TABLE billing.refunds ENABLE TRIGGER USER;
ALTER TABLE billing.disputes ENABLE TRIGGER USER;
ALTER TABLE billing.refund_events ENABLE TRIGGER USER;
ALTER TABLE billing.dispute_events ENABLE TRIGGER USER;

-- +goose StatementBegin
DO $$
DECLARE
    orphans text;
BEGIN
    SELECT string_agg(stripe_refund_id, ', ') INTO orphans FROM billing.refunds WHERE customer_id IS NULL;
    IF orphans IS NULL THEN
        SELECT string_agg(stripe_dispute_id, ', ') INTO orphans FROM billing.disputes WHERE customer_id IS NULL;
    END IF;
    IF orphans IS NOT NULL THEN
        RAISE EXCEPTION 'refunds or disputes of no charge of Tally''s: %', orphans
            USING HINT = 'set each one''s charge_id to the charge it adjusts, then migrate again';
    END IF;
END
$$;
-- +goose StatementEnd

ALTER TABLE billing.charge_attempts ALTER COLUMN customer_id SET NOT NULL;
ALTER TABLE billing.charge_transitions ALTER COLUMN customer_id SET NOT NULL;
ALTER TABLE billing.charge_lines ALTER COLUMN customer_id SET NOT NULL;
ALTER TABLE billing.statements ALTER COLUMN customer_id SET NOT NULL;
ALTER TABLE billing.refunds ALTER COLUMN customer_id SET NOT NULL;
ALTER TABLE billing.disputes ALTER COLUMN customer_id SET NOT NULL;
ALTER TABLE billing.refund_events ALTER COLUMN customer_id SET NOT NULL;
ALTER TABLE billing.dispute_events ALTER COLUMN customer_id SET NOT NULL;
COMMENT ON COLUMN billing.charge_attempts.customer_id IS 'The charge''s customer.';
COMMENT ON COLUMN billing.charge_transitions.customer_id IS 'The charge''s customer.';
COMMENT ON COLUMN billing.charge_lines.customer_id IS 'The charge''s customer.';
COMMENT ON COLUMN billing.statements.customer_id IS 'The charge''s customer.';
COMMENT ON COLUMN billing.refunds.customer_id IS 'The refunded charge''s customer.';
COMMENT ON COLUMN billing.disputes.customer_id IS 'The disputed charge''s customer.';
COMMENT ON COLUMN billing.refund_events.customer_id IS 'The refund''s customer.';
COMMENT ON COLUMN billing.dispute_events.customer_id IS 'The dispute''s customer.';

ALTER TABLE billing.charge_attempts DROP CONSTRAINT charge_attempts_charge_id_fkey;
ALTER TABLE billing.charge_transitions DROP CONSTRAINT charge_transitions_charge_id_fkey;
ALTER TABLE billing.charge_lines DROP CONSTRAINT charge_lines_charge_id_fkey;
ALTER TABLE billing.statements DROP CONSTRAINT statements_charge_id_fkey;
ALTER TABLE billing.refunds DROP CONSTRAINT refunds_charge_id_fkey;
ALTER TABLE billing.disputes DROP CONSTRAINT disputes_charge_id_fkey;
ALTER TABLE billing.credit_grant_entries DROP CONSTRAINT credit_grant_entries_charge_id_fkey;
ALTER TABLE billing.operator_actions DROP CONSTRAINT operator_actions_charge_id_fkey;
ALTER TABLE billing.refund_events DROP CONSTRAINT refund_events_stripe_refund_id_fkey;
ALTER TABLE billing.dispute_events DROP CONSTRAINT dispute_events_stripe_dispute_id_fkey;
ALTER TABLE billing.charges
    DROP CONSTRAINT charges_carried_into_fkey,
    DROP CONSTRAINT charges_pkey,
    ADD CONSTRAINT charges_pkey PRIMARY KEY (id, customer_id),
    DROP CONSTRAINT charges_charge_key_key,
    ADD CONSTRAINT charges_charge_key_key UNIQUE (charge_key, customer_id),
    DROP CONSTRAINT charges_idempotency_key_key,
    ADD CONSTRAINT charges_idempotency_key_key UNIQUE (idempotency_key, customer_id),
    DROP CONSTRAINT charges_stripe_payment_intent_id_key,
    ADD CONSTRAINT charges_stripe_payment_intent_id_key UNIQUE (stripe_payment_intent_id, customer_id),
    ADD CONSTRAINT charges_carried_into_fkey FOREIGN KEY (carried_into, customer_id) REFERENCES billing.charges (id, customer_id);
ALTER TABLE billing.refunds
    DROP CONSTRAINT refunds_pkey,
    ADD CONSTRAINT refunds_pkey PRIMARY KEY (stripe_refund_id, customer_id);
ALTER TABLE billing.disputes
    DROP CONSTRAINT disputes_pkey,
    ADD CONSTRAINT disputes_pkey PRIMARY KEY (stripe_dispute_id, customer_id);

ALTER TABLE billing.charge_attempts
    DROP CONSTRAINT charge_attempts_pkey,
    ADD CONSTRAINT charge_attempts_pkey PRIMARY KEY (id, customer_id),
    DROP CONSTRAINT charge_attempts_charge_id_attempt_key,
    ADD CONSTRAINT charge_attempts_charge_id_attempt_key UNIQUE (charge_id, attempt, customer_id),
    ADD CONSTRAINT charge_attempts_charge_id_fkey FOREIGN KEY (charge_id, customer_id) REFERENCES billing.charges (id, customer_id);
ALTER TABLE billing.charge_transitions
    DROP CONSTRAINT charge_transitions_pkey,
    ADD CONSTRAINT charge_transitions_pkey PRIMARY KEY (id, customer_id),
    ADD CONSTRAINT charge_transitions_charge_id_fkey FOREIGN KEY (charge_id, customer_id) REFERENCES billing.charges (id, customer_id);
ALTER TABLE billing.charge_lines
    DROP CONSTRAINT charge_lines_pkey,
    ADD CONSTRAINT charge_lines_pkey PRIMARY KEY (charge_id, line, customer_id),
    ADD CONSTRAINT charge_lines_charge_id_fkey FOREIGN KEY (charge_id, customer_id) REFERENCES billing.charges (id, customer_id);
DROP INDEX billing.charge_lines_metric_key;
DROP INDEX billing.charge_lines_kind_key;
DROP INDEX billing.charge_lines_grant_key;
CREATE UNIQUE INDEX charge_lines_metric_key ON billing.charge_lines (charge_id, metric, customer_id) WHERE kind = 'usage';
CREATE UNIQUE INDEX charge_lines_kind_key ON billing.charge_lines (charge_id, kind, customer_id) WHERE kind NOT IN ('usage', 'credit');
CREATE UNIQUE INDEX charge_lines_grant_key ON billing.charge_lines (charge_id, grant_id, customer_id) WHERE kind = 'credit';
ALTER TABLE billing.statements
    DROP CONSTRAINT statements_pkey,
    ADD CONSTRAINT statements_pkey PRIMARY KEY (number, customer_id),
    DROP CONSTRAINT statements_charge_id_key,
    ADD CONSTRAINT statements_charge_id_key UNIQUE (charge_id, customer_id),
    ADD CONSTRAINT statements_charge_id_fkey FOREIGN KEY (charge_id, customer_id) REFERENCES billing.charges (id, customer_id);
ALTER TABLE billing.refunds
    ADD CONSTRAINT refunds_charge_id_fkey FOREIGN KEY (charge_id, customer_id) REFERENCES billing.charges (id, customer_id);
ALTER TABLE billing.disputes
    ADD CONSTRAINT disputes_charge_id_fkey FOREIGN KEY (charge_id, customer_id) REFERENCES billing.charges (id, customer_id);
ALTER TABLE billing.credit_grant_entries
    DROP CONSTRAINT credit_grant_entries_pkey,
    ADD CONSTRAINT credit_grant_entries_pkey PRIMARY KEY (id, customer_id),
    ADD CONSTRAINT credit_grant_entries_charge_id_fkey FOREIGN KEY (charge_id, customer_id) REFERENCES billing.charges (id, customer_id);
ALTER TABLE billing.refund_events
    DROP CONSTRAINT refund_events_pkey,
    ADD CONSTRAINT refund_events_pkey PRIMARY KEY (id, customer_id),
    ADD CONSTRAINT refund_events_stripe_refund_id_fkey FOREIGN KEY (stripe_refund_id, customer_id)
        REFERENCES billing.refunds (stripe_refund_id, customer_id);
ALTER TABLE billing.dispute_events
    DROP CONSTRAINT dispute_events_pkey,
    ADD CONSTRAINT dispute_events_pkey PRIMARY KEY (id, customer_id),
    ADD CONSTRAINT dispute_events_stripe_dispute_id_fkey FOREIGN KEY (stripe_dispute_id, customer_id)
        REFERENCES billing.disputes (stripe_dispute_id, customer_id);
DROP INDEX billing.refund_events_event_key;
DROP INDEX billing.dispute_events_event_key;
CREATE UNIQUE INDEX refund_events_event_key ON billing.refund_events (stripe_refund_id, coalesce(stripe_event_id, ''), customer_id);
CREATE UNIQUE INDEX dispute_events_event_key ON billing.dispute_events (stripe_dispute_id, coalesce(stripe_event_id, ''), customer_id);

-- +goose Down
DROP INDEX billing.refund_events_event_key;
DROP INDEX billing.dispute_events_event_key;
CREATE UNIQUE INDEX refund_events_event_key ON billing.refund_events (stripe_refund_id, coalesce(stripe_event_id, ''));
CREATE UNIQUE INDEX dispute_events_event_key ON billing.dispute_events (stripe_dispute_id, coalesce(stripe_event_id, ''));
ALTER TABLE billing.dispute_events
    DROP CONSTRAINT dispute_events_stripe_dispute_id_fkey,
    DROP CONSTRAINT dispute_events_pkey,
    ADD CONSTRAINT dispute_events_pkey PRIMARY KEY (id);
ALTER TABLE billing.refund_events
    DROP CONSTRAINT refund_events_stripe_refund_id_fkey,
    DROP CONSTRAINT refund_events_pkey,
    ADD CONSTRAINT refund_events_pkey PRIMARY KEY (id);
ALTER TABLE billing.credit_grant_entries
    DROP CONSTRAINT credit_grant_entries_charge_id_fkey,
    DROP CONSTRAINT credit_grant_entries_pkey,
    ADD CONSTRAINT credit_grant_entries_pkey PRIMARY KEY (id);
ALTER TABLE billing.disputes DROP CONSTRAINT disputes_charge_id_fkey;
ALTER TABLE billing.refunds DROP CONSTRAINT refunds_charge_id_fkey;
ALTER TABLE billing.statements
    DROP CONSTRAINT statements_charge_id_fkey,
    DROP CONSTRAINT statements_charge_id_key,
    ADD CONSTRAINT statements_charge_id_key UNIQUE (charge_id),
    DROP CONSTRAINT statements_pkey,
    ADD CONSTRAINT statements_pkey PRIMARY KEY (number);
DROP INDEX billing.charge_lines_metric_key;
DROP INDEX billing.charge_lines_kind_key;
DROP INDEX billing.charge_lines_grant_key;
CREATE UNIQUE INDEX charge_lines_metric_key ON billing.charge_lines (charge_id, metric) WHERE kind = 'usage';
CREATE UNIQUE INDEX charge_lines_kind_key ON billing.charge_lines (charge_id, kind) WHERE kind NOT IN ('usage', 'credit');
CREATE UNIQUE INDEX charge_lines_grant_key ON billing.charge_lines (charge_id, grant_id) WHERE kind = 'credit';
ALTER TABLE billing.charge_lines
    DROP CONSTRAINT charge_lines_charge_id_fkey,
    DROP CONSTRAINT charge_lines_pkey,
    ADD CONSTRAINT charge_lines_pkey PRIMARY KEY (charge_id, line);
ALTER TABLE billing.charge_transitions
    DROP CONSTRAINT charge_transitions_charge_id_fkey,
    DROP CONSTRAINT charge_transitions_pkey,
    ADD CONSTRAINT charge_transitions_pkey PRIMARY KEY (id);
ALTER TABLE billing.charge_attempts
    DROP CONSTRAINT charge_attempts_charge_id_fkey,
    DROP CONSTRAINT charge_attempts_charge_id_attempt_key,
    ADD CONSTRAINT charge_attempts_charge_id_attempt_key UNIQUE (charge_id, attempt),
    DROP CONSTRAINT charge_attempts_pkey,
    ADD CONSTRAINT charge_attempts_pkey PRIMARY KEY (id);
ALTER TABLE billing.disputes
    DROP CONSTRAINT disputes_pkey,
    ADD CONSTRAINT disputes_pkey PRIMARY KEY (stripe_dispute_id);
ALTER TABLE billing.refunds
    DROP CONSTRAINT refunds_pkey,
    ADD CONSTRAINT refunds_pkey PRIMARY KEY (stripe_refund_id);
ALTER TABLE billing.charges
    DROP CONSTRAINT charges_carried_into_fkey,
    DROP CONSTRAINT charges_stripe_payment_intent_id_key,
    ADD CONSTRAINT charges_stripe_payment_intent_id_key UNIQUE (stripe_payment_intent_id),
    DROP CONSTRAINT charges_idempotency_key_key,
    ADD CONSTRAINT charges_idempotency_key_key UNIQUE (idempotency_key),
    DROP CONSTRAINT charges_charge_key_key,
    ADD CONSTRAINT charges_charge_key_key UNIQUE (charge_key),
    DROP CONSTRAINT charges_pkey,
    ADD CONSTRAINT charges_pkey PRIMARY KEY (id),
    ADD CONSTRAINT charges_carried_into_fkey FOREIGN KEY (carried_into) REFERENCES billing.charges (id);
ALTER TABLE billing.dispute_events
    ADD CONSTRAINT dispute_events_stripe_dispute_id_fkey FOREIGN KEY (stripe_dispute_id) REFERENCES billing.disputes (stripe_dispute_id);
ALTER TABLE billing.refund_events
    ADD CONSTRAINT refund_events_stripe_refund_id_fkey FOREIGN KEY (stripe_refund_id) REFERENCES billing.refunds (stripe_refund_id);
ALTER TABLE billing.operator_actions
    ADD CONSTRAINT operator_actions_charge_id_fkey FOREIGN KEY (charge_id) REFERENCES billing.charges (id);
ALTER TABLE billing.credit_grant_entries
    ADD CONSTRAINT credit_grant_entries_charge_id_fkey FOREIGN KEY (charge_id) REFERENCES billing.charges (id);
ALTER TABLE billing.disputes
    ADD CONSTRAINT disputes_charge_id_fkey FOREIGN KEY (charge_id) REFERENCES billing.charges (id);
ALTER TABLE billing.refunds
    ADD CONSTRAINT refunds_charge_id_fkey FOREIGN KEY (charge_id) REFERENCES billing.charges (id);
ALTER TABLE billing.statements
    ADD CONSTRAINT statements_charge_id_fkey FOREIGN KEY (charge_id) REFERENCES billing.charges (id);
ALTER TABLE billing.charge_lines
    ADD CONSTRAINT charge_lines_charge_id_fkey FOREIGN KEY (charge_id) REFERENCES billing.charges (id);
ALTER TABLE billing.charge_transitions
    ADD CONSTRAINT charge_transitions_charge_id_fkey FOREIGN KEY (charge_id) REFERENCES billing.charges (id);
ALTER TABLE billing.charge_attempts
    ADD CONSTRAINT charge_attempts_charge_id_fkey FOREIGN KEY (charge_id) REFERENCES billing.charges (id);
ALTER TABLE billing.dispute_events DROP COLUMN customer_id;
ALTER TABLE billing.refund_events DROP COLUMN customer_id;
ALTER TABLE billing.disputes DROP COLUMN customer_id;
ALTER TABLE billing.refunds DROP COLUMN customer_id;
ALTER TABLE billing.statements DROP COLUMN customer_id;
ALTER TABLE billing.charge_lines DROP COLUMN customer_id;
ALTER TABLE billing.charge_transitions DROP COLUMN customer_id;
ALTER TABLE billing.charge_attempts DROP COLUMN customer_id;
