-- Every usage event belongs to a period that exists: the foreign key from
-- billing.usage_events to billing.periods said so with a check per inserted
-- row (a query and a row lock each, 5-7 µs a row: the largest cost of a
-- 1,000-event batch after the insert itself, see docs/benchmarks.md). Tally's
-- inserts already lock their period FOR KEY SHARE in the same transaction
-- (the lock against a close), so the per-row lock bought nothing; the check is
-- now one anti-join per statement, and the referenced side keeps the foreign
-- key's NO ACTION rule: a period with events cannot be deleted or re-keyed.
-- Both raise foreign_key_violation (23503), as the constraint did.

-- +goose Up
ALTER TABLE billing.usage_events DROP CONSTRAINT usage_events_customer_id_period_fkey;

-- +goose StatementBegin
CREATE FUNCTION billing.usage_events_period_exists() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    missing record;
BEGIN
    SELECT n.customer_id, n.period INTO missing
    FROM inserted n
    WHERE NOT EXISTS (SELECT 1 FROM billing.periods p
                      WHERE p.customer_id = n.customer_id AND p.period = n.period)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'insert into billing.usage_events: period % of customer % does not exist',
            missing.period, missing.customer_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER usage_events_period_exists
    AFTER INSERT ON billing.usage_events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION billing.usage_events_period_exists();

-- +goose StatementBegin
CREATE FUNCTION billing.periods_keep_events() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND (NEW.customer_id, NEW.period) = (OLD.customer_id, OLD.period) THEN
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT 1 FROM billing.usage_events e
               WHERE e.customer_id = OLD.customer_id AND e.period = OLD.period) THEN
        RAISE EXCEPTION '% of billing.periods: period % of customer % has usage events',
            TG_OP, OLD.period, OLD.customer_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER periods_keep_events
    BEFORE DELETE OR UPDATE OF customer_id, period ON billing.periods
    FOR EACH ROW EXECUTE FUNCTION billing.periods_keep_events();

COMMENT ON TRIGGER usage_events_period_exists ON billing.usage_events IS
    'Every event''s (customer_id, period) is a row of billing.periods: one check per statement.';
COMMENT ON TRIGGER periods_keep_events ON billing.periods IS
    'A period with usage events cannot be deleted or re-keyed (the rule of the foreign key it replaces).';

-- +goose Down
DROP TRIGGER periods_keep_events ON billing.periods;
DROP FUNCTION billing.periods_keep_events();
DROP TRIGGER usage_events_period_exists ON billing.usage_events;
DROP FUNCTION billing.usage_events_period_exists();
ALTER TABLE billing.usage_events
    ADD CONSTRAINT usage_events_customer_id_period_fkey
    FOREIGN KEY (customer_id, period) REFERENCES billing.periods (customer_id, period);
