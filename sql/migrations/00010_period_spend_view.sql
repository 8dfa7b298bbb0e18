-- The per-period spend is derived from the charges (budget_reserved) instead
-- of kept in one row per (period, currency): that row was updated by every
-- charge's claim, so every charge of a period queued behind the one before it
-- to commit. A budget check now takes a transaction-level advisory lock per
-- (period, currency) and sums this index; without a budget nothing is shared.

-- +goose Up
DROP TABLE billing.period_spend;

CREATE INDEX charges_period_spend_idx ON billing.charges (period, currency) INCLUDE (amount_cents)
    WHERE budget_reserved;

CREATE VIEW billing.period_spend AS
SELECT period, currency, sum(amount_cents)::bigint AS reserved_cents
FROM billing.charges
WHERE budget_reserved
GROUP BY period, currency;

COMMENT ON VIEW billing.period_spend IS
    'Per period label and currency: the amounts of charges in flight plus those that succeeded '
    '(charges.budget_reserved). TALLY_PERIOD_BUDGET_CENTS caps it; a charge that would exceed it '
    'is held over_period_budget.';

-- +goose Down
DROP VIEW billing.period_spend;
DROP INDEX billing.charges_period_spend_idx;

CREATE TABLE billing.period_spend (
    period         text   NOT NULL,
    currency       text   NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    reserved_cents bigint NOT NULL DEFAULT 0 CHECK (reserved_cents >= 0),
    PRIMARY KEY (period, currency)
);

COMMENT ON TABLE billing.period_spend IS
    'Per period label and currency: the amounts of charges in flight plus those that succeeded. '
    'TALLY_PERIOD_BUDGET_CENTS caps it; a charge that would exceed it is held over_period_budget.';

INSERT INTO billing.period_spend (period, currency, reserved_cents)
SELECT period, currency, sum(amount_cents) FROM billing.charges
WHERE budget_reserved
GROUP BY period, currency;
