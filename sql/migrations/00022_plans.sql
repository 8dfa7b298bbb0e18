-- Plans (GitHub issue 24): versioned price books. A plan has one currency
-- for good; each PUT of new content adds a version, and a version is never
-- changed or removed (a period records the version it is rated with, so a
-- price change never rewrites a period that has started).
--
-- plan_versions.price_book is the plan's canonical JSON (pricing.Plan's
-- MarshalJSON) as text, byte for byte: jsonb would reorder its keys, and the
-- bytes are what a PUT of the same content is compared with (a replay).
-- plan_prices repeats each metric's price as jsonb, one row per metric, for
-- SQL to read and for ingest to find, by its key, whether a version prices
-- a metric; PlanPut derives its rows from the version's price_book in the
-- statement that inserts the version.
--
-- PlanPut (internal/ledger/price_plan.go) serializes the versions of a plan
-- by locking its billing.plans row (FOR NO KEY UPDATE, which leaves the
-- foreign keys of customers that reference it free).

-- +goose Up
CREATE TABLE billing.plans (
    plan_id    text        PRIMARY KEY CHECK (octet_length(plan_id) BETWEEN 1 AND 255),
    currency   text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    created_at timestamptz NOT NULL,
    created_by text        NOT NULL CHECK (created_by <> ''),
    UNIQUE (plan_id, currency)
);

COMMENT ON TABLE billing.plans IS
    'Price books by plan_id, each in one currency for good; their content is in billing.plan_versions. Append-only.';
COMMENT ON COLUMN billing.plans.created_by IS 'Who created the plan (its first version): operator:<key name>/<key prefix> or cli:<os user>.';

CREATE TABLE billing.plan_versions (
    plan_id    text        NOT NULL,
    version    integer     NOT NULL CHECK (version >= 1),
    currency   text        NOT NULL,
    price_book text        NOT NULL CHECK (octet_length(price_book) <= 1048576),
    created_at timestamptz NOT NULL,
    created_by text        NOT NULL CHECK (created_by <> ''),
    PRIMARY KEY (plan_id, version),
    FOREIGN KEY (plan_id, currency) REFERENCES billing.plans (plan_id, currency),
    CHECK (price_book::jsonb ->> 'currency' = currency),
    CHECK (jsonb_typeof(price_book::jsonb -> 'prices') = 'object')
);

COMMENT ON TABLE billing.plan_versions IS
    'Every version of every plan, numbered from 1 per plan; append-only. A period is rated with the version '
    'in force when it opened (billing.periods.plan_id, plan_version).';
COMMENT ON COLUMN billing.plan_versions.price_book IS
    'The version''s canonical JSON, {"currency":…,"prices":{…}}, byte for byte (text, not jsonb: jsonb reorders keys). '
    'A PUT whose canonical JSON equals the latest version''s is a replay and adds nothing.';
COMMENT ON COLUMN billing.plan_versions.created_by IS 'Who put the version: operator:<key name>/<key prefix> or cli:<os user>.';

CREATE TABLE billing.plan_prices (
    plan_id text  NOT NULL,
    version integer NOT NULL,
    metric  text  NOT NULL CHECK (octet_length(metric) BETWEEN 1 AND 255),
    model   text  NOT NULL CHECK (model IN ('per_unit', 'graduated', 'volume', 'package')),
    price   jsonb NOT NULL CHECK (jsonb_typeof(price) = 'object' AND price ->> 'model' = model),
    PRIMARY KEY (plan_id, version, metric),
    FOREIGN KEY (plan_id, version) REFERENCES billing.plan_versions (plan_id, version)
);

COMMENT ON TABLE billing.plan_prices IS
    'Each metric''s price in each plan version, as in the version''s price_book (decimals as strings, in minor units). '
    'Append-only.';

CREATE TRIGGER plans_append_only
    BEFORE UPDATE OR DELETE ON billing.plans
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER plans_no_truncate
    BEFORE TRUNCATE ON billing.plans
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER plan_versions_append_only
    BEFORE UPDATE OR DELETE ON billing.plan_versions
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER plan_versions_no_truncate
    BEFORE TRUNCATE ON billing.plan_versions
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER plan_prices_append_only
    BEFORE UPDATE OR DELETE ON billing.plan_prices
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER plan_prices_no_truncate
    BEFORE TRUNCATE ON billing.plan_prices
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        GRANT SELECT ON billing.plans, billing.plan_versions, billing.plan_prices TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE billing.plan_prices;
DROP TABLE billing.plan_versions;
DROP TABLE billing.plans;
