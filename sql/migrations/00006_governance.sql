-- Spend governance and operator control.
--
-- The charge status machine, written once: internal/ledger/charge_status.go
-- holds the table of allowed status changes (and who may make each);
-- billing.charge_status_transitions holds the same (from, to) pairs, and a
-- trigger refuses any other change of billing.charges.status. A test checks
-- that the two agree.
--
-- held_reason becomes a code (why a charge waits for an operator) and
-- held_detail the human text; held_at says since when, held_alerted_at when
-- the reconciler last reported it. approved_at marks an operator's approval:
-- the guards (cap, budget, anomaly) are waived for that charge.
--
-- billing.period_spend is the per-period budget: per period label and
-- currency, the amount reserved by charges in flight plus those that
-- succeeded (budget_reserved marks the charges counted in it).
--
-- billing.operator_actions is the append-only log of every operator action.

-- +goose Up
ALTER TABLE billing.charges ADD COLUMN held_detail text;
UPDATE billing.charges SET held_detail = held_reason, held_reason = CASE
    WHEN held_reason LIKE 'double_charge%' THEN 'double_charge'
    WHEN held_reason LIKE 'payment_intent_mismatch%' THEN 'payment_intent_mismatch'
    WHEN held_reason LIKE 'idempotency_error%' THEN 'idempotency_error'
    WHEN held_reason LIKE '%max_charge_cents%' THEN 'over_customer_cap'
    ELSE 'unexpected_status' END
WHERE held_reason IS NOT NULL;
ALTER TABLE billing.charges ADD CONSTRAINT charges_held_reason_check CHECK (held_reason IN (
    'over_customer_cap', 'over_period_budget', 'anomaly', 'idempotency_error',
    'payment_intent_mismatch', 'double_charge', 'unexpected_status'));
ALTER TABLE billing.charges ADD COLUMN held_at timestamptz;
UPDATE billing.charges SET held_at = updated_at WHERE status = 'held';
ALTER TABLE billing.charges ADD CONSTRAINT charges_held_at_check CHECK (status <> 'held' OR held_at IS NOT NULL);
ALTER TABLE billing.charges ADD COLUMN held_alerted_at timestamptz;
ALTER TABLE billing.charges ADD COLUMN approved_at timestamptz;
ALTER TABLE billing.charges ADD COLUMN budget_reserved boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN billing.charges.held_reason IS
    'Why the charge is or was held: over_customer_cap, over_period_budget, anomaly, idempotency_error, '
    'payment_intent_mismatch, double_charge, unexpected_status. docs/operations.md says what to do for each.';
COMMENT ON COLUMN billing.charges.approved_at IS
    'An operator approved the held charge: its guards (cap, budget, anomaly) are waived.';
COMMENT ON COLUMN billing.charges.budget_reserved IS
    'The charge''s amount is counted in billing.period_spend (in flight or succeeded).';

CREATE INDEX charges_held_idx ON billing.charges (held_at) WHERE status = 'held';

CREATE TABLE billing.charge_status_transitions (
    from_status text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (from_status, to_status)
);

COMMENT ON TABLE billing.charge_status_transitions IS
    'The allowed changes of billing.charges.status, the same pairs as the table in '
    'internal/ledger/charge_status.go; a trigger refuses any other.';

INSERT INTO billing.charge_status_transitions (from_status, to_status) VALUES
    ('pending', 'processing'), ('pending', 'succeeded'), ('pending', 'failed'), ('pending', 'unknown'),
    ('pending', 'held'), ('pending', 'canceled'),
    ('unknown', 'pending'), ('unknown', 'processing'), ('unknown', 'succeeded'), ('unknown', 'failed'),
    ('unknown', 'held'),
    ('processing', 'succeeded'), ('processing', 'failed'), ('processing', 'held'),
    ('held', 'pending'), ('held', 'succeeded'), ('held', 'canceled'),
    ('failed', 'succeeded');

-- +goose StatementBegin
CREATE FUNCTION billing.charges_status_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT EXISTS (
        SELECT 1 FROM billing.charge_status_transitions
        WHERE from_status = OLD.status AND to_status = NEW.status) THEN
        RAISE EXCEPTION 'charge % may not move from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation', HINT = 'see internal/ledger/charge_status.go';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER charges_status_guard
    BEFORE UPDATE OF status ON billing.charges
    FOR EACH ROW EXECUTE FUNCTION billing.charges_status_guard();

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
WHERE status IN ('pending', 'unknown', 'processing', 'succeeded') AND attempt_count > 0
GROUP BY period, currency;
UPDATE billing.charges SET budget_reserved = true
WHERE status IN ('pending', 'unknown', 'processing', 'succeeded') AND attempt_count > 0;

CREATE TABLE billing.operator_actions (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action        text        NOT NULL CHECK (action IN (
        'approve', 'cancel', 'resolve', 'charging_pause', 'charging_resume', 'lookup_mark')),
    charge_id     bigint      REFERENCES billing.charges (id),
    actor         text        NOT NULL,
    reason        text        NOT NULL CHECK (char_length(reason) BETWEEN 1 AND 1000),
    status_before text,
    status_after  text,
    detail        jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL
);

COMMENT ON TABLE billing.operator_actions IS
    'Every operator action (approve, cancel, resolve, charging pause/resume): who (api key name and '
    'prefix, or cli:<os user>), when, why, and the charge''s status before and after. Append-only.';

CREATE INDEX operator_actions_charge_idx ON billing.operator_actions (charge_id, id);
CREATE INDEX operator_actions_charging_idx ON billing.operator_actions (id)
    WHERE action IN ('charging_pause', 'charging_resume');
CREATE TRIGGER operator_actions_append_only
    BEFORE UPDATE OR DELETE ON billing.operator_actions
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER operator_actions_no_truncate
    BEFORE TRUNCATE ON billing.operator_actions
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

ALTER TABLE billing.refunds ALTER COLUMN stripe_event_id DROP NOT NULL;

-- +goose Down
ALTER TABLE billing.refunds ALTER COLUMN stripe_event_id SET NOT NULL;
DROP TABLE billing.operator_actions;
DROP TABLE billing.period_spend;
DROP TRIGGER charges_status_guard ON billing.charges;
DROP FUNCTION billing.charges_status_guard();
DROP TABLE billing.charge_status_transitions;
DROP INDEX billing.charges_held_idx;
ALTER TABLE billing.charges DROP COLUMN budget_reserved;
ALTER TABLE billing.charges DROP COLUMN approved_at;
ALTER TABLE billing.charges DROP COLUMN held_alerted_at;
ALTER TABLE billing.charges DROP CONSTRAINT charges_held_at_check;
ALTER TABLE billing.charges DROP COLUMN held_at;
ALTER TABLE billing.charges DROP CONSTRAINT charges_held_reason_check;
UPDATE billing.charges SET held_reason = coalesce(held_detail, held_reason) WHERE held_reason IS NOT NULL;
ALTER TABLE billing.charges DROP COLUMN held_detail;
