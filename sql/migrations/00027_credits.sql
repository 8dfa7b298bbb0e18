-- Prepaid credits (GitHub issue 25): grants, and their burn-down by the close.
--
-- A grant (billing.credit_grants) gives a customer an amount in one currency,
-- idempotent on the customer's grant_id. It is never changed: what happens
-- to it is an entry (billing.credit_grant_entries), each with a signed
-- amount, so a grant's remaining amount is the sum of its entries:
--   granted  +amount, written with the grant;
--   applied  -what the close of a charge applied (one per charge and grant);
--   expired  -what was left unused at expires_at (breakage);
--   voided   -what was left unused when an operator voided the grant.
-- A grant's entries are numbered (seq, from 1, unique per grant) and each
-- carries what is left after it (remaining_cents, never below zero): every
-- writer locks the grant's row (FOR UPDATE), reads its last entry in the
-- next statement and appends the next one, seq + 1, with that entry's
-- remaining_cents plus its own amount. Two writers that read the same last
-- entry (one that skipped the lock) cannot both append: the second breaks
-- the unique seq and rolls back. (A foreign key from each entry to the one
-- before would hold the arithmetic too; it took closes with credits past the
-- 10% more they may cost, docs/benchmarks.md, so the view billing.credit_chain_breaks
-- shows a break instead; it is empty.)
--
-- The close applies credits after rating, in its transaction: each grant
-- that was valid when the period ended (created by then, not expired then,
-- same currency), ordered by priority, then earliest expiry, then oldest,
-- covers what remains of the lines it may cover (all of them, or the usage
-- lines of its metrics). Each grant applied is a charge line of kind
-- credit (a negative amount: the charge is still the sum of its lines) and
-- an applied entry. A charge with a positive total that credits cover whole
-- is created covered: terminal, no Stripe call.

-- +goose Up
CREATE TABLE billing.credit_grants (
    customer_id  text        NOT NULL REFERENCES billing.customers (customer_id),
    grant_id     text        NOT NULL CHECK (octet_length(grant_id) BETWEEN 1 AND 255),
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    currency     text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    category     text        NOT NULL CHECK (category IN ('paid', 'promotional')),
    priority     integer     NOT NULL CHECK (priority BETWEEN 0 AND 1000),
    expires_at   timestamptz CHECK (expires_at > created_at),
    metrics      text[]      CHECK (cardinality(metrics) BETWEEN 1 AND 100),
    created_at   timestamptz NOT NULL,
    created_by   text        NOT NULL CHECK (created_by <> ''),
    PRIMARY KEY (customer_id, grant_id)
);

COMMENT ON TABLE billing.credit_grants IS
    'Prepaid credits given to a customer, by the customer''s grant_id; append-only. What remains of a grant is the '
    'sum of its entries (billing.credit_entries).';
COMMENT ON COLUMN billing.credit_grants.category IS
    'paid (bought: a top-up, or sold outside Tally) or promotional (given away); finance books them apart.';
COMMENT ON COLUMN billing.credit_grants.priority IS
    'Lower is applied first; then the earliest expires_at, then the oldest grant.';
COMMENT ON COLUMN billing.credit_grants.expires_at IS
    'The grant covers periods that end before it; what is left at that time expires (an expired entry).';
COMMENT ON COLUMN billing.credit_grants.metrics IS
    'When set, the grant covers only the usage lines of these metrics; otherwise every line of a charge.';
COMMENT ON COLUMN billing.credit_grants.created_by IS
    'Who granted it: operator:<key name>/<key prefix> or cli:<os user>.';

CREATE TABLE billing.credit_grant_entries (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id     text        NOT NULL,
    grant_id        text        NOT NULL,
    seq             integer     NOT NULL CHECK (seq >= 1),
    kind            text        NOT NULL CHECK (kind IN ('granted', 'applied', 'expired', 'voided')),
    amount_cents    bigint      NOT NULL CHECK (amount_cents <> 0),
    remaining_cents bigint      NOT NULL CHECK (remaining_cents >= 0),
    charge_id       bigint      REFERENCES billing.charges (id),
    reason          text        CHECK (char_length(reason) BETWEEN 1 AND 1000),
    actor           text        NOT NULL CHECK (actor <> ''),
    created_at      timestamptz NOT NULL,
    FOREIGN KEY (customer_id, grant_id) REFERENCES billing.credit_grants (customer_id, grant_id),
    UNIQUE (customer_id, grant_id, seq),
    CHECK ((seq = 1) = (kind = 'granted')),
    CHECK (kind <> 'granted' OR remaining_cents = amount_cents),
    CHECK ((kind = 'granted') = (amount_cents > 0)),
    CHECK ((kind = 'applied') = (charge_id IS NOT NULL)),
    CHECK (kind <> 'voided' OR reason IS NOT NULL)
);

CREATE UNIQUE INDEX credit_grant_entries_end_key ON billing.credit_grant_entries (customer_id, grant_id)
    WHERE kind IN ('expired', 'voided');
CREATE UNIQUE INDEX credit_grant_entries_applied_key ON billing.credit_grant_entries (charge_id, customer_id, grant_id)
    WHERE kind = 'applied';

COMMENT ON TABLE billing.credit_grant_entries IS
    'Everything that happened to a grant, as signed amounts: granted (+), applied to a charge, expired, voided (-). '
    'A grant''s remaining amount is the sum of its entries, never below zero. Append-only.';
COMMENT ON COLUMN billing.credit_grant_entries.seq IS
    'The entry''s number in its grant''s chain, from 1 (the granted entry); unique per grant.';
COMMENT ON COLUMN billing.credit_grant_entries.remaining_cents IS
    'What is left of the grant after this entry: the previous entry''s remaining_cents plus amount_cents, never below '
    'zero; billing.credit_chain_breaks lists an entry where that does not hold.';
COMMENT ON COLUMN billing.credit_grant_entries.charge_id IS 'The charge an applied entry paid for (its credit line).';
COMMENT ON COLUMN billing.credit_grant_entries.actor IS
    'Who wrote it: operator:<key name>/<key prefix>, cli:<os user>, or job:<id>/<attempt> (a close, an expiry).';

CREATE TRIGGER credit_grants_append_only
    BEFORE UPDATE OR DELETE ON billing.credit_grants
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER credit_grants_no_truncate
    BEFORE TRUNCATE ON billing.credit_grants
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER credit_grant_entries_append_only
    BEFORE UPDATE OR DELETE ON billing.credit_grant_entries
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER credit_grant_entries_no_truncate
    BEFORE TRUNCATE ON billing.credit_grant_entries
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

CREATE VIEW billing.credit_entries AS
SELECT e.id, e.customer_id, e.grant_id, g.currency, g.category, e.seq, e.kind, e.amount_cents, e.remaining_cents,
       e.charge_id, e.reason, e.actor, e.created_at
FROM billing.credit_grant_entries e
JOIN billing.credit_grants g ON g.customer_id = e.customer_id AND g.grant_id = e.grant_id;

COMMENT ON VIEW billing.credit_entries IS
    'Every credit entry with its grant''s currency and category, and what remained of the grant after it '
    '(remaining_cents): the sum of a grant''s entries is what is left of it (docs/sql.md).';

CREATE VIEW billing.credit_chain_breaks AS
SELECT customer_id, grant_id, seq, kind, amount_cents, remaining_cents, sum_cents, prev_seq
FROM (SELECT e.customer_id, e.grant_id, e.seq, e.kind, e.amount_cents, e.remaining_cents,
             sum(e.amount_cents) OVER (PARTITION BY e.customer_id, e.grant_id ORDER BY e.seq) AS sum_cents,
             lag(e.seq) OVER (PARTITION BY e.customer_id, e.grant_id ORDER BY e.seq) AS prev_seq
      FROM billing.credit_grant_entries e) c
WHERE remaining_cents <> sum_cents OR seq <> coalesce(prev_seq, 0) + 1;

COMMENT ON VIEW billing.credit_chain_breaks IS
    'An entry whose remaining_cents is not the sum of its grant''s entries up to it, or whose seq does not follow the '
    'one before. Empty: Tally never writes one.';

-- A charge's credit lines: one per grant applied, a negative amount.
ALTER TABLE billing.charge_lines ADD COLUMN grant_id text;
ALTER TABLE billing.charge_lines DROP CONSTRAINT charge_lines_kind_check;
ALTER TABLE billing.charge_lines ADD CONSTRAINT charge_lines_kind_check
    CHECK (kind IN ('usage', 'pre_priced', 'carried', 'credit'));
ALTER TABLE billing.charge_lines DROP CONSTRAINT charge_lines_exact_amount_check;
ALTER TABLE billing.charge_lines DROP CONSTRAINT charge_lines_amount_cents_check;
ALTER TABLE billing.charge_lines ADD CONSTRAINT charge_lines_amount_sign_check
    CHECK (CASE WHEN kind = 'credit' THEN amount_cents < 0 ELSE amount_cents >= 0 AND exact_amount >= 0 END);
ALTER TABLE billing.charge_lines ADD CONSTRAINT charge_lines_grant_check
    CHECK ((kind = 'credit') = (grant_id IS NOT NULL) AND (kind <> 'credit' OR event_count = 0));
DROP INDEX billing.charge_lines_kind_key;
CREATE UNIQUE INDEX charge_lines_kind_key ON billing.charge_lines (charge_id, kind) WHERE kind NOT IN ('usage', 'credit');
CREATE UNIQUE INDEX charge_lines_grant_key ON billing.charge_lines (charge_id, grant_id) WHERE kind = 'credit';
COMMENT ON COLUMN billing.charge_lines.grant_id IS
    'A credit line''s grant (of the charge''s customer): its amount is minus the grant''s applied entry for the charge.';

CREATE OR REPLACE VIEW billing.charge_line_items AS
SELECT l.charge_id, c.customer_id, c.period, c.status AS charge_status, c.currency, l.line, l.kind, l.metric,
       l.plan_id, l.plan_version, l.model, l.quantity, l.event_count, l.tiers, l.packages, l.subtotal,
       l.minimum_applied, l.exact_amount, l.amount_cents, l.created_at, l.grant_id
FROM billing.charge_lines l
JOIN billing.charges c ON c.id = l.charge_id;

ALTER TABLE billing.charges DROP CONSTRAINT charges_status_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_status_check CHECK (status IN (
    'pending', 'processing', 'unknown', 'held', 'succeeded', 'failed', 'skipped', 'canceled', 'carried_forward',
    'past_due', 'uncollectible', 'covered'));
ALTER TABLE billing.charges ADD CONSTRAINT charges_covered_check CHECK (status <> 'covered' OR amount_cents = 0);

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        GRANT SELECT ON billing.credit_grants, billing.credit_grant_entries, billing.credit_entries,
            billing.credit_chain_breaks TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE billing.charges DROP CONSTRAINT charges_covered_check;
ALTER TABLE billing.charges DROP CONSTRAINT charges_status_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_status_check CHECK (status IN (
    'pending', 'processing', 'unknown', 'held', 'succeeded', 'failed', 'skipped', 'canceled', 'carried_forward',
    'past_due', 'uncollectible'));
DROP VIEW billing.charge_line_items;
CREATE VIEW billing.charge_line_items AS
SELECT l.charge_id, c.customer_id, c.period, c.status AS charge_status, c.currency, l.line, l.kind, l.metric,
       l.plan_id, l.plan_version, l.model, l.quantity, l.event_count, l.tiers, l.packages, l.subtotal,
       l.minimum_applied, l.exact_amount, l.amount_cents, l.created_at
FROM billing.charge_lines l
JOIN billing.charges c ON c.id = l.charge_id;
COMMENT ON VIEW billing.charge_line_items IS
    'Every charge''s lines with the charge''s customer, period, status and currency: revenue per metric and plan '
    'version is the sum of amount_cents over succeeded charges (docs/sql.md).';
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        GRANT SELECT ON billing.charge_line_items TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd
DROP INDEX billing.charge_lines_grant_key;
DROP INDEX billing.charge_lines_kind_key;
CREATE UNIQUE INDEX charge_lines_kind_key ON billing.charge_lines (charge_id, kind) WHERE kind <> 'usage';
ALTER TABLE billing.charge_lines DROP CONSTRAINT charge_lines_grant_check;
ALTER TABLE billing.charge_lines DROP CONSTRAINT charge_lines_amount_sign_check;
ALTER TABLE billing.charge_lines ADD CONSTRAINT charge_lines_exact_amount_check CHECK (exact_amount >= 0);
ALTER TABLE billing.charge_lines ADD CONSTRAINT charge_lines_amount_cents_check CHECK (amount_cents >= 0);
ALTER TABLE billing.charge_lines DROP CONSTRAINT charge_lines_kind_check;
ALTER TABLE billing.charge_lines ADD CONSTRAINT charge_lines_kind_check
    CHECK (kind IN ('usage', 'pre_priced', 'carried'));
ALTER TABLE billing.charge_lines DROP COLUMN grant_id;
DROP VIEW billing.credit_chain_breaks;
DROP VIEW billing.credit_entries;
DROP TABLE billing.credit_grant_entries;
DROP TABLE billing.credit_grants;
