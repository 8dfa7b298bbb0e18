-- Quantity events (GitHub issue 24). An event is either pre-priced
-- (amount_cents, billed as sent; metric an optional label) or a quantity of
-- a metric (metric and quantity, amount_cents NULL), priced with the plan
-- version its period opened with; ingest refuses a quantity of a metric
-- that version does not price. Quantities are exact decimals (numeric, at
-- most 12 digits after the point, stored without trailing zeros) where they
-- were whole numbers (bigint).
--
-- Events recorded before may carry both an amount and a quantity (the
-- quantity was a label then): usage_events_amount_or_quantity is NOT
-- VALID, so it holds for every row from now on and leaves those as they
-- are. Those events are pre-priced.
--
-- The change of quantity's type rewrites billing.usage_events and its
-- indexes, in one pass with the checks, holding the table's exclusive lock
-- throughout: ingest waits for the migration, for a time that grows with
-- the table (plan it for a quiet hour on a large ledger).

-- +goose Up
ALTER TABLE billing.usage_events
    ALTER COLUMN amount_cents DROP NOT NULL,
    ALTER COLUMN quantity TYPE numeric,
    DROP CONSTRAINT usage_events_quantity_check,
    ADD CONSTRAINT usage_events_quantity_check
        CHECK (quantity >= 0 AND quantity < 1e20 AND scale(quantity) <= 12),
    ADD CONSTRAINT usage_events_priced
        CHECK (amount_cents IS NOT NULL OR (quantity IS NOT NULL AND metric IS NOT NULL));
ALTER TABLE billing.usage_events ADD CONSTRAINT usage_events_amount_or_quantity
    CHECK (amount_cents IS NULL OR quantity IS NULL) NOT VALID;

COMMENT ON COLUMN billing.usage_events.amount_cents IS
    'A pre-priced event''s amount, billed as sent; NULL for a quantity event, which its period''s plan version prices.';
COMMENT ON COLUMN billing.usage_events.quantity IS
    'A quantity event''s quantity of metric, exact; NULL for a pre-priced event (one recorded before quantity events '
    'existed may carry one beside its amount, as a label).';

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM billing.usage_events WHERE amount_cents IS NULL OR quantity <> trunc(quantity)) THEN
        RAISE EXCEPTION 'billing.usage_events holds quantity events (or fractional quantities), which the schema before 00024 cannot hold'
            USING HINT = 'they are the ledger: keep this migration';
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE billing.usage_events
    DROP CONSTRAINT usage_events_amount_or_quantity,
    DROP CONSTRAINT usage_events_priced,
    DROP CONSTRAINT usage_events_quantity_check,
    ALTER COLUMN quantity TYPE bigint,
    ADD CONSTRAINT usage_events_quantity_check CHECK (quantity >= 0),
    ALTER COLUMN amount_cents SET NOT NULL;
COMMENT ON COLUMN billing.usage_events.amount_cents IS NULL;
COMMENT ON COLUMN billing.usage_events.quantity IS NULL;
