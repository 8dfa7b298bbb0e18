-- Deployment namespaces (TALLY_NAMESPACE): charges created from now on derive
-- their charge key and idempotency keys from
-- "tally:charge:v2:" || namespace || ":" || customer_id || ":" || period, and
-- their PaymentIntents carry metadata.tally_namespace, so two deployments
-- sharing one Stripe account never adopt, hold or reconcile each other's
-- PaymentIntents. key_namespace is stored per charge: NULL for the charges
-- keyed before (v1), which keep their keys.

-- +goose Up
ALTER TABLE billing.charges ADD COLUMN key_namespace text
    CHECK (key_namespace IS NULL OR key_namespace ~ '^[a-z0-9][a-z0-9_-]{0,62}$');

COMMENT ON COLUMN billing.charges.key_namespace IS
    'TALLY_NAMESPACE when the charge was created (its keys are v2, derived with it); NULL: a v1 charge.';

-- +goose Down
ALTER TABLE billing.charges DROP COLUMN key_namespace;
