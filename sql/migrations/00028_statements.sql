-- Statements (GitHub issue 25): every settled charge (succeeded, or covered
-- by credits) has a statement, numbered per deployment from 1, without gaps,
-- in the order charges settle, and never renumbered. The number is taken in
-- the transaction that settles the charge, from billing.statement_counter
-- (one row, locked until that transaction ends): a transaction that rolls
-- back gives its number back with it, so no number is skipped; a sequence
-- would skip one.
--
-- Charges that settled before this migration are numbered here, in the
-- order they settled (their last transition into their status).

-- +goose Up
CREATE TABLE billing.statement_counter (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    last_number bigint  NOT NULL CHECK (last_number >= 0)
);

COMMENT ON TABLE billing.statement_counter IS
    'The last statement number issued; one row, locked by each settlement until it commits, so numbers have no gaps.';

CREATE TABLE billing.statements (
    number    bigint      PRIMARY KEY CHECK (number >= 1),
    charge_id bigint      NOT NULL UNIQUE REFERENCES billing.charges (id),
    issued_at timestamptz NOT NULL
);

COMMENT ON TABLE billing.statements IS
    'Each settled charge''s statement number: from 1 per deployment, no gaps, in the order charges settled; '
    'append-only. GET /v1/charges/{id}/statement renders it.';

CREATE TRIGGER statements_append_only
    BEFORE UPDATE OR DELETE ON billing.statements
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER statements_no_truncate
    BEFORE TRUNCATE ON billing.statements
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

INSERT INTO billing.statements (number, charge_id, issued_at)
SELECT row_number() OVER (ORDER BY s.settled_at, s.id), s.id, s.settled_at
FROM (SELECT c.id, coalesce((SELECT max(t.created_at) FROM billing.charge_transitions t
                             WHERE t.charge_id = c.id AND t.to_status = c.status), c.updated_at) AS settled_at
      FROM billing.charges c WHERE c.status IN ('succeeded', 'covered')) s;
INSERT INTO billing.statement_counter (last_number) SELECT count(*) FROM billing.statements;

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        GRANT SELECT ON billing.statements, billing.statement_counter TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE billing.statements;
DROP TABLE billing.statement_counter;
