-- The reconciler's own bookmark: when it last checked a charge with Stripe,
-- so it works through every unsettled charge in turn instead of re-polling
-- the oldest ones each run.

-- +goose Up
ALTER TABLE billing.charges ADD COLUMN reconciled_at timestamptz;

COMMENT ON COLUMN billing.charges.reconciled_at IS
    'When the reconciler last checked this charge with Stripe; it waits TALLY_RECONCILE_AFTER before checking again.';

-- +goose Down
ALTER TABLE billing.charges DROP COLUMN reconciled_at;
