-- Totals Stripe refuses. A total below the currency's minimum charge amount
-- is carried forward: the charge settles carried_forward (no Stripe call) and
-- the customer's next charge adds it (carried_in_cents), pointing back through
-- carried_into. A total above Stripe's maximum is held amount_too_large.

-- +goose Up
ALTER TABLE billing.charges DROP CONSTRAINT charges_status_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_status_check CHECK (status IN (
    'pending', 'processing', 'unknown', 'held', 'succeeded', 'failed', 'skipped', 'canceled', 'carried_forward'));
ALTER TABLE billing.charges DROP CONSTRAINT charges_held_reason_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_held_reason_check CHECK (held_reason IN (
    'over_customer_cap', 'over_period_budget', 'anomaly', 'idempotency_error',
    'payment_intent_mismatch', 'double_charge', 'unexpected_status', 'amount_too_large'));

ALTER TABLE billing.charges ADD COLUMN carried_in_cents bigint NOT NULL DEFAULT 0 CHECK (carried_in_cents >= 0);
ALTER TABLE billing.charges ADD COLUMN carried_into bigint REFERENCES billing.charges (id);
ALTER TABLE billing.charges ADD CONSTRAINT charges_carried_into_check
    CHECK (carried_into IS NULL OR status = 'carried_forward');
ALTER TABLE billing.charges ADD CONSTRAINT charges_carried_in_check CHECK (carried_in_cents <= amount_cents);
CREATE INDEX charges_carried_open_idx ON billing.charges (customer_id)
    WHERE status = 'carried_forward' AND carried_into IS NULL;

COMMENT ON COLUMN billing.charges.carried_in_cents IS
    'The part of amount_cents carried from earlier charges below Stripe''s minimum (their carried_into is this charge); '
    'amount_cents - carried_in_cents is this period''s own events.';
COMMENT ON COLUMN billing.charges.carried_into IS
    'For a carried_forward charge: the later charge of the same customer that bills its amount (NULL: still waiting).';

INSERT INTO billing.charge_status_transitions (from_status, to_status) VALUES ('pending', 'carried_forward');

CREATE VIEW billing.customer_carried_forward AS
SELECT customer_id, currency, sum(amount_cents)::bigint AS carried_cents, count(*) AS charges,
       min(period) AS since_period
FROM billing.charges
WHERE status = 'carried_forward' AND carried_into IS NULL
GROUP BY customer_id, currency;

COMMENT ON VIEW billing.customer_carried_forward IS
    'Per customer and currency, the amounts carried forward (below Stripe''s minimum) that no later charge bills yet.';

-- +goose Down
DROP VIEW billing.customer_carried_forward;
DELETE FROM billing.charge_status_transitions WHERE to_status = 'carried_forward';
DROP INDEX billing.charges_carried_open_idx;
ALTER TABLE billing.charges DROP CONSTRAINT charges_carried_in_check;
ALTER TABLE billing.charges DROP CONSTRAINT charges_carried_into_check;
ALTER TABLE billing.charges DROP COLUMN carried_into;
ALTER TABLE billing.charges DROP COLUMN carried_in_cents;
ALTER TABLE billing.charges DROP CONSTRAINT charges_held_reason_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_held_reason_check CHECK (held_reason IN (
    'over_customer_cap', 'over_period_budget', 'anomaly', 'idempotency_error',
    'payment_intent_mismatch', 'double_charge', 'unexpected_status'));
ALTER TABLE billing.charges DROP CONSTRAINT charges_status_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_status_check CHECK (status IN (
    'pending', 'processing', 'unknown', 'held', 'succeeded', 'failed', 'skipped', 'canceled'));
