-- Customers on plans (GitHub issue 24). A customer may be on one plan, in
-- its own currency (the foreign key names both, so neither a plan in
-- another currency nor a currency change that leaves the plan's behind can
-- be stored). A period records the plan and the version in force when it
-- opened (its first event), and keeps them: a new version, or another plan
-- for the customer, applies from the customer's next period. A period
-- opened before its customer had a plan has none.

-- +goose Up
ALTER TABLE billing.customers ADD COLUMN plan_id text;
ALTER TABLE billing.customers ADD CONSTRAINT customers_plan_fkey
    FOREIGN KEY (plan_id, currency) REFERENCES billing.plans (plan_id, currency);
COMMENT ON COLUMN billing.customers.plan_id IS
    'The plan whose latest version prices the customer''s next period; null for none. In the customer''s currency.';

ALTER TABLE billing.periods ADD COLUMN plan_id text;
ALTER TABLE billing.periods ADD COLUMN plan_version integer;
ALTER TABLE billing.periods ADD CONSTRAINT periods_plan_check CHECK ((plan_id IS NULL) = (plan_version IS NULL));
ALTER TABLE billing.periods ADD CONSTRAINT periods_plan_fkey
    FOREIGN KEY (plan_id, plan_version) REFERENCES billing.plan_versions (plan_id, version);
COMMENT ON COLUMN billing.periods.plan_id IS
    'The customer''s plan when the period opened (null: none); the period is priced with it, whatever changes later.';
COMMENT ON COLUMN billing.periods.plan_version IS 'The version of plan_id in force when the period opened.';

-- +goose StatementBegin
CREATE FUNCTION billing.periods_keep_plan() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.plan_id, NEW.plan_version) IS DISTINCT FROM (OLD.plan_id, OLD.plan_version) THEN
        RAISE EXCEPTION 'billing.periods: the plan of period % of customer % is the one in force when it opened; it cannot change',
            OLD.period, OLD.customer_id
            USING ERRCODE = 'raise_exception', HINT = 'a new plan or version applies from the customer''s next period';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER periods_keep_plan
    BEFORE UPDATE OF plan_id, plan_version ON billing.periods
    FOR EACH ROW EXECUTE FUNCTION billing.periods_keep_plan();

-- +goose Down
DROP TRIGGER periods_keep_plan ON billing.periods;
DROP FUNCTION billing.periods_keep_plan();
ALTER TABLE billing.periods DROP COLUMN plan_version;
ALTER TABLE billing.periods DROP COLUMN plan_id;
ALTER TABLE billing.customers DROP COLUMN plan_id;
