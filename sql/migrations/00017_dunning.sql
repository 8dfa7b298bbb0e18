-- Dunning (GitHub issue 14): a charge that Stripe declined for a reason a
-- later try can fix becomes past_due instead of failed, and is retried on a
-- schedule (TALLY_DUNNING_SCHEDULE, offsets from its first decline); after the
-- last retry it is uncollectible (terminal).
--
-- A retry first cancels, on Stripe, every PaymentIntent carrying the charge's
-- key that could still succeed, and records them in
-- retired_payment_intent_ids; only then does the charge move to its next key
-- generation and create a new PaymentIntent. A canceled PaymentIntent can
-- never succeed: a charge has at most one succeeded PaymentIntent.

-- +goose Up
ALTER TABLE billing.charges DROP CONSTRAINT charges_status_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_status_check CHECK (status IN (
    'pending', 'processing', 'unknown', 'held', 'succeeded', 'failed', 'skipped', 'canceled', 'carried_forward',
    'past_due', 'uncollectible'));

ALTER TABLE billing.charges ADD COLUMN past_due_since timestamptz;
ALTER TABLE billing.charges ADD COLUMN next_retry_at timestamptz;
ALTER TABLE billing.charges ADD COLUMN dunning_retries integer NOT NULL DEFAULT 0 CHECK (dunning_retries >= 0);
ALTER TABLE billing.charges ADD COLUMN retired_payment_intent_ids text[] NOT NULL DEFAULT '{}';
ALTER TABLE billing.charges ADD CONSTRAINT charges_past_due_check
    CHECK (status <> 'past_due' OR (next_retry_at IS NOT NULL AND past_due_since IS NOT NULL));

COMMENT ON COLUMN billing.charges.past_due_since IS
    'When Stripe first declined the charge for a reason a later try can fix; the dunning schedule counts from here.';
COMMENT ON COLUMN billing.charges.next_retry_at IS
    'For a past_due charge: when its next retry runs (POST /v1/charges/{id}/retry sets it to now).';
COMMENT ON COLUMN billing.charges.dunning_retries IS
    'Retries made so far, scheduled or asked for with POST /v1/charges/{id}/retry; the next one is due at '
    'past_due_since + the schedule''s entry of that index.';
COMMENT ON COLUMN billing.charges.retired_payment_intent_ids IS
    'PaymentIntents carrying the charge''s key that a retry canceled on Stripe before it created a new one: '
    'their news (a late webhook) never moves the charge.';

ALTER TABLE billing.operator_actions DROP CONSTRAINT operator_actions_action_check;
ALTER TABLE billing.operator_actions ADD CONSTRAINT operator_actions_action_check CHECK (action IN (
    'approve', 'cancel', 'resolve', 'charging_pause', 'charging_resume', 'lookup_mark', 'retry'));

CREATE INDEX charges_retry_due_idx ON billing.charges (next_retry_at) WHERE status = 'past_due';

INSERT INTO billing.charge_status_transitions (from_status, to_status) VALUES
    ('pending', 'past_due'), ('unknown', 'past_due'), ('processing', 'past_due'),
    ('pending', 'uncollectible'), ('unknown', 'uncollectible'), ('processing', 'uncollectible'),
    ('past_due', 'pending'), ('past_due', 'processing'), ('past_due', 'succeeded'), ('past_due', 'held'),
    ('uncollectible', 'succeeded');

CREATE OR REPLACE VIEW billing.charges_open AS
SELECT id AS charge_id, customer_id, period, status, amount_cents, currency, held_reason, held_detail, held_at,
       attempt_count, last_attempted_at, created_at,
       now() - created_at AS age,
       now() - coalesce(held_at, last_attempted_at, created_at) AS waiting_for,
       next_retry_at
FROM billing.charges
WHERE status IN ('pending', 'unknown', 'processing', 'held', 'past_due');

COMMENT ON VIEW billing.charges_open IS
    'Charges not settled yet — held (waiting for an operator), past_due (waiting for their next retry, next_retry_at) '
    'or in flight — with their age.';

-- +goose Down
DROP VIEW billing.charges_open;
CREATE VIEW billing.charges_open AS
SELECT id AS charge_id, customer_id, period, status, amount_cents, currency, held_reason, held_detail, held_at,
       attempt_count, last_attempted_at, created_at,
       now() - created_at AS age,
       now() - coalesce(held_at, last_attempted_at, created_at) AS waiting_for
FROM billing.charges
WHERE status IN ('pending', 'unknown', 'processing', 'held');
COMMENT ON VIEW billing.charges_open IS
    'Charges not settled yet — held (waiting for an operator) or in flight — with their age.';
DELETE FROM billing.charge_status_transitions WHERE to_status IN ('past_due', 'uncollectible')
    OR from_status IN ('past_due', 'uncollectible');
DROP INDEX billing.charges_retry_due_idx;
ALTER TABLE billing.operator_actions DROP CONSTRAINT operator_actions_action_check;
ALTER TABLE billing.operator_actions ADD CONSTRAINT operator_actions_action_check CHECK (action IN (
    'approve', 'cancel', 'resolve', 'charging_pause', 'charging_resume', 'lookup_mark'));
ALTER TABLE billing.charges DROP CONSTRAINT charges_past_due_check;
ALTER TABLE billing.charges DROP COLUMN retired_payment_intent_ids;
ALTER TABLE billing.charges DROP COLUMN dunning_retries;
ALTER TABLE billing.charges DROP COLUMN next_retry_at;
ALTER TABLE billing.charges DROP COLUMN past_due_since;
ALTER TABLE billing.charges DROP CONSTRAINT charges_status_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_status_check CHECK (status IN (
    'pending', 'processing', 'unknown', 'held', 'succeeded', 'failed', 'skipped', 'canceled', 'carried_forward'));
