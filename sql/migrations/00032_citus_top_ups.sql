-- Top-ups and voids in the shape a sharded Postgres (Citus) requires of a
-- table distributed by customer_id (docs/scaling.md, "Distributed by
-- customer_id (Citus): a plan"; TestCitusShape): every key includes
-- customer_id, and so does every foreign key between customer-owned tables.
--
-- Nothing a key guaranteed is lost on Postgres: ids come from their
-- sequences, a top-up key is derived from its customer, a grant's top-up
-- belongs to the grant's customer (the foreign key now says so). Key columns
-- stay first, so a look-up by id, by PaymentIntent or by key still descends
-- the same index. One guarantee is weaker: a PaymentIntent id is unique per
-- customer, no longer across customers (each top-up's PaymentIntent is
-- created with its own idempotency key and found again by its metadata
-- key, never by its id alone).

-- +goose Up
ALTER TABLE billing.top_up_transitions ADD COLUMN customer_id text;
ALTER TABLE billing.top_up_transitions DISABLE TRIGGER top_up_transitions_append_only;
UPDATE billing.top_up_transitions x SET customer_id = t.customer_id FROM billing.top_ups t WHERE t.id = x.top_up;
ALTER TABLE billing.top_up_transitions ENABLE TRIGGER top_up_transitions_append_only;
ALTER TABLE billing.top_up_transitions ALTER COLUMN customer_id SET NOT NULL;
COMMENT ON COLUMN billing.top_up_transitions.customer_id IS 'The top-up''s customer.';

ALTER TABLE billing.top_up_transitions DROP CONSTRAINT top_up_transitions_top_up_fkey;
ALTER TABLE billing.credit_grants DROP CONSTRAINT credit_grants_top_up_id_fkey;
ALTER TABLE billing.top_ups
    DROP CONSTRAINT top_ups_pkey,
    ADD CONSTRAINT top_ups_pkey PRIMARY KEY (id, customer_id),
    DROP CONSTRAINT top_ups_stripe_payment_intent_id_key,
    ADD CONSTRAINT top_ups_stripe_payment_intent_id_key UNIQUE (stripe_payment_intent_id, customer_id),
    DROP CONSTRAINT top_ups_top_up_key_key,
    ADD CONSTRAINT top_ups_top_up_key_key UNIQUE (top_up_key, customer_id);
ALTER TABLE billing.top_up_transitions
    DROP CONSTRAINT top_up_transitions_pkey,
    ADD CONSTRAINT top_up_transitions_pkey PRIMARY KEY (id, customer_id),
    ADD CONSTRAINT top_up_transitions_top_up_fkey FOREIGN KEY (top_up, customer_id) REFERENCES billing.top_ups (id, customer_id);
ALTER TABLE billing.credit_grants
    DROP CONSTRAINT credit_grants_top_up_id_key,
    ADD CONSTRAINT credit_grants_top_up_id_key UNIQUE (top_up_id, customer_id),
    ADD CONSTRAINT credit_grants_top_up_id_fkey FOREIGN KEY (top_up_id, customer_id) REFERENCES billing.top_ups (id, customer_id);

ALTER TABLE billing.usage_event_voids
    DROP CONSTRAINT usage_event_voids_id_key,
    ADD CONSTRAINT usage_event_voids_id_key UNIQUE (id, customer_id);

-- +goose Down
ALTER TABLE billing.usage_event_voids
    DROP CONSTRAINT usage_event_voids_id_key,
    ADD CONSTRAINT usage_event_voids_id_key UNIQUE (id);

ALTER TABLE billing.credit_grants
    DROP CONSTRAINT credit_grants_top_up_id_fkey,
    DROP CONSTRAINT credit_grants_top_up_id_key,
    ADD CONSTRAINT credit_grants_top_up_id_key UNIQUE (top_up_id);
ALTER TABLE billing.top_up_transitions
    DROP CONSTRAINT top_up_transitions_top_up_fkey,
    DROP CONSTRAINT top_up_transitions_pkey,
    ADD CONSTRAINT top_up_transitions_pkey PRIMARY KEY (id);
ALTER TABLE billing.top_ups
    DROP CONSTRAINT top_ups_top_up_key_key,
    ADD CONSTRAINT top_ups_top_up_key_key UNIQUE (top_up_key),
    DROP CONSTRAINT top_ups_stripe_payment_intent_id_key,
    ADD CONSTRAINT top_ups_stripe_payment_intent_id_key UNIQUE (stripe_payment_intent_id),
    DROP CONSTRAINT top_ups_pkey,
    ADD CONSTRAINT top_ups_pkey PRIMARY KEY (id);
ALTER TABLE billing.credit_grants
    ADD CONSTRAINT credit_grants_top_up_id_fkey FOREIGN KEY (top_up_id) REFERENCES billing.top_ups (id);
ALTER TABLE billing.top_up_transitions
    ADD CONSTRAINT top_up_transitions_top_up_fkey FOREIGN KEY (top_up) REFERENCES billing.top_ups (id);
ALTER TABLE billing.top_up_transitions DROP COLUMN customer_id;
