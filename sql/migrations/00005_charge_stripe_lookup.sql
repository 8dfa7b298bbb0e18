-- Tally's own record of its Stripe calls can be lost: a restored backup, or a
-- failover that drops the last commits. A charge then looks never attempted,
-- and its key may be one Stripe has already forgotten. So before the first
-- call of a key generation that this database holds no attempt of, the worker
-- looks at Stripe: it lists the Stripe customer's PaymentIntents created since
-- the period began and matches metadata.tally_charge_key.
--
-- period_starts_at: the charge's own copy of when its period began, the lower
-- bound of that listing.
-- lookup_required: set by `billingctl recover` after such a loss, so the next
-- call looks at Stripe first even where the record shows earlier attempts.

-- +goose Up
ALTER TABLE billing.charges ADD COLUMN period_starts_at timestamptz;
UPDATE billing.charges c SET period_starts_at = p.starts_at
FROM billing.periods p
WHERE p.customer_id = c.customer_id AND p.period = c.period;
ALTER TABLE billing.charges ALTER COLUMN period_starts_at SET NOT NULL;

ALTER TABLE billing.charges ADD COLUMN lookup_required boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN billing.charges.period_starts_at IS
    'Start of the charge''s period: a look-up at Stripe lists the customer''s PaymentIntents created since then (minus a margin).';
COMMENT ON COLUMN billing.charges.lookup_required IS
    'Set after a restore or a lossy failover (billingctl recover): the next call of this charge first looks for its PaymentIntents on Stripe.';

-- +goose Down
ALTER TABLE billing.charges DROP COLUMN lookup_required;
ALTER TABLE billing.charges DROP COLUMN period_starts_at;
