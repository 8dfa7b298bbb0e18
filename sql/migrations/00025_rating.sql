-- Corrections and what a charge is made of (GitHub issue 24).
--
-- A usage event is voided, while its period is open, by a row in
-- billing.usage_event_voids: the event stays as it was, and every sum nets
-- it out (billing.usage_events_counted is the events not voided; the close,
-- the views and the API count those). A void is attributed and
-- append-only, like the event.
--
-- The close rates its period
-- into lines, in the transaction that creates the charge, and the charge's
-- amount is their sum:
--   usage       one per metric of the period's quantity events: the net
--               quantity, priced with the plan version the period opened
--               with (billing.periods.plan_id, plan_version), rounded
--               half-up to the minor unit once;
--   pre_priced  the period's events that came with amount_cents, summed;
--   carried     earlier charges carried forward (below Stripe's minimum)
--               that this charge bills (billing.charges.carried_into).
-- Lines are append-only, like the events they come from.
--
-- Charges created before this migration get their lines here, from what
-- they recorded: a pre_priced line (amount less what was carried in) and a
-- carried line. They had no quantity events and no voids.

-- +goose Up
CREATE TABLE billing.usage_event_voids (
    customer_id text        NOT NULL,
    event_id    text        NOT NULL,
    period      text        NOT NULL,
    reason      text        NOT NULL CHECK (octet_length(reason) BETWEEN 1 AND 500),
    voided_by   text        NOT NULL CHECK (voided_by <> ''),
    voided_at   timestamptz NOT NULL,
    PRIMARY KEY (customer_id, event_id),
    FOREIGN KEY (customer_id, event_id) REFERENCES billing.usage_events (customer_id, event_id),
    FOREIGN KEY (customer_id, period) REFERENCES billing.periods (customer_id, period)
);

COMMENT ON TABLE billing.usage_event_voids IS
    'Usage events voided (POST /v1/usage-events/void) while their period was open: the event stays in '
    'billing.usage_events and counts in no sum. One per event; append-only.';
COMMENT ON COLUMN billing.usage_event_voids.voided_by IS
    'Who voided it: operator:<key name>/<key prefix> (an API key) or cli:<os user>.';

CREATE TRIGGER usage_event_voids_append_only
    BEFORE UPDATE OR DELETE ON billing.usage_event_voids
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER usage_event_voids_no_truncate
    BEFORE TRUNCATE ON billing.usage_event_voids
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

CREATE VIEW billing.usage_events_counted AS
SELECT e.id, e.customer_id, e.event_id, e.period, e.amount_cents, e.currency, e.quantity, e.metric, e.properties,
       e.occurred_at, e.received_at
FROM billing.usage_events e
WHERE NOT EXISTS (SELECT 1 FROM billing.usage_event_voids v WHERE v.customer_id = e.customer_id AND v.event_id = e.event_id);

COMMENT ON VIEW billing.usage_events_counted IS
    'The usage events that count: every event not voided. Sums of usage read this, not billing.usage_events.';

CREATE OR REPLACE VIEW billing.period_totals AS
SELECT p.customer_id, p.period, p.currency, p.status AS period_status, p.starts_at, p.ends_at, p.closes_at,
       p.closed_at, coalesce(t.event_count, 0) AS event_count, coalesce(t.total_cents, 0)::bigint AS total_cents,
       c.id AS charge_id, c.status AS charge_status, c.amount_cents AS charge_amount_cents, c.carried_in_cents
FROM billing.periods p
LEFT JOIN LATERAL (
    SELECT count(*) AS event_count, sum(e.amount_cents) AS total_cents
    FROM billing.usage_events_counted e
    WHERE e.customer_id = p.customer_id AND e.period = p.period
) t ON true
LEFT JOIN billing.charges c ON c.customer_id = p.customer_id AND c.period = p.period;

COMMENT ON VIEW billing.period_totals IS
    'One row per (customer, period): its events'' count and pre-priced total (voided events left out), and its '
    'charge''s status and amount once closed.';

CREATE TABLE billing.charge_lines (
    charge_id       bigint      NOT NULL REFERENCES billing.charges (id),
    line            integer     NOT NULL CHECK (line >= 1),
    kind            text        NOT NULL CHECK (kind IN ('usage', 'pre_priced', 'carried')),
    metric          text,
    plan_id         text,
    plan_version    integer,
    model           text,
    quantity        numeric     CHECK (quantity >= 0),
    event_count     bigint      NOT NULL CHECK (event_count >= 0),
    tiers           jsonb       CHECK (jsonb_typeof(tiers) = 'array'),
    packages        numeric,
    subtotal        numeric,
    minimum_applied boolean     NOT NULL DEFAULT false,
    exact_amount    numeric     NOT NULL CHECK (exact_amount >= 0),
    amount_cents    bigint      NOT NULL CHECK (amount_cents >= 0),
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (charge_id, line),
    FOREIGN KEY (plan_id, plan_version, metric) REFERENCES billing.plan_prices (plan_id, version, metric),
    CHECK ((kind = 'usage') = (metric IS NOT NULL AND plan_id IS NOT NULL AND plan_version IS NOT NULL
                               AND model IS NOT NULL AND quantity IS NOT NULL AND subtotal IS NOT NULL)),
    CHECK (kind = 'usage' OR (metric IS NULL AND plan_id IS NULL AND plan_version IS NULL AND model IS NULL
                              AND quantity IS NULL AND tiers IS NULL AND packages IS NULL AND subtotal IS NULL
                              AND NOT minimum_applied AND exact_amount = amount_cents)),
    CHECK (kind <> 'carried' OR event_count = 0)
);

CREATE UNIQUE INDEX charge_lines_metric_key ON billing.charge_lines (charge_id, metric) WHERE kind = 'usage';
CREATE UNIQUE INDEX charge_lines_kind_key ON billing.charge_lines (charge_id, kind) WHERE kind <> 'usage';

COMMENT ON TABLE billing.charge_lines IS
    'What each charge is made of: one usage line per metric rated, one pre_priced line, one carried line; the '
    'charge''s amount_cents is the sum of its lines'' amount_cents. Written with the charge at the close; append-only.';
COMMENT ON COLUMN billing.charge_lines.quantity IS 'A usage line''s net quantity of metric in the period, exact.';
COMMENT ON COLUMN billing.charge_lines.event_count IS
    'The events behind the line: the metric''s quantity events (usage) or the pre-priced events (pre_priced); 0 for carried.';
COMMENT ON COLUMN billing.charge_lines.tiers IS
    'A graduated or volume line''s tiers: [{tier (its number in the price, from 1), quantity, unit_amount, flat_amount, '
    'amount}], decimals as strings, '
    'each tier''s amount exact (only the line''s total is rounded).';
COMMENT ON COLUMN billing.charge_lines.packages IS 'A package line''s packages started.';
COMMENT ON COLUMN billing.charge_lines.subtotal IS 'A usage line''s exact amount under its model, before the minimum.';
COMMENT ON COLUMN billing.charge_lines.minimum_applied IS
    'The price''s minimum raised the line: its quantity was above zero and its subtotal below the minimum.';
COMMENT ON COLUMN billing.charge_lines.exact_amount IS 'The line''s exact amount, in minor units: what amount_cents rounds half-up.';

CREATE TRIGGER charge_lines_append_only
    BEFORE UPDATE OR DELETE ON billing.charge_lines
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER charge_lines_no_truncate
    BEFORE TRUNCATE ON billing.charge_lines
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

INSERT INTO billing.charge_lines (charge_id, line, kind, event_count, exact_amount, amount_cents, created_at)
SELECT id, 1, 'pre_priced', event_count, amount_cents - carried_in_cents, amount_cents - carried_in_cents, created_at
FROM billing.charges
WHERE event_count > 0 OR amount_cents > carried_in_cents;
INSERT INTO billing.charge_lines (charge_id, line, kind, event_count, exact_amount, amount_cents, created_at)
SELECT id, CASE WHEN event_count > 0 OR amount_cents > carried_in_cents THEN 2 ELSE 1 END, 'carried', 0,
       carried_in_cents, carried_in_cents, created_at
FROM billing.charges
WHERE carried_in_cents > 0;

CREATE VIEW billing.charge_line_items AS
SELECT l.charge_id, c.customer_id, c.period, c.status AS charge_status, c.currency, l.line, l.kind, l.metric,
       l.plan_id, l.plan_version, l.model, l.quantity, l.event_count, l.tiers, l.packages, l.subtotal,
       l.minimum_applied, l.exact_amount, l.amount_cents, l.created_at
FROM billing.charge_lines l
JOIN billing.charges c ON c.id = l.charge_id;

COMMENT ON VIEW billing.charge_line_items IS
    'Every charge''s lines with the charge''s customer, period, status and currency: revenue per metric and plan '
    'version is the sum of amount_cents over succeeded charges (docs/sql.md).';

-- The reconciliation now holds a charge to its lines: their sum must be its
-- amount, its pre_priced line its events'' amounts, its carried line what it
-- carried in, and each usage line''s quantity its metric''s quantity events.
-- events_cents stays the pre-priced events'' total; rated_cents (new, last)
-- is the usage lines''. Voided events count in none of it.
CREATE OR REPLACE VIEW billing.reconciliation AS
WITH charge AS (
    SELECT c.id, c.customer_id, c.period, c.status, c.currency, c.amount_cents, c.carried_in_cents,
           c.stripe_payment_intent_id,
           (SELECT coalesce(sum(e.amount_cents), 0) FROM billing.usage_events_counted e
             WHERE e.customer_id = c.customer_id AND e.period = c.period)::bigint AS events_cents,
           (SELECT (s.payload -> 'data' -> 'object' ->> 'amount_received')::bigint FROM billing.stripe_events s
             WHERE s.type LIKE 'payment_intent.%' AND s.type = 'payment_intent.succeeded'
               AND s.payload -> 'data' -> 'object' ->> 'id' = c.stripe_payment_intent_id
             ORDER BY s.created_at DESC LIMIT 1) AS stripe_received_cents,
           l.lines_cents, l.pre_priced_cents, l.carried_cents, l.rated_cents,
           EXISTS (
               SELECT 1 FROM billing.charge_lines u
               WHERE u.charge_id = c.id AND u.kind = 'usage'
                 AND u.quantity IS DISTINCT FROM (
                     SELECT sum(e.quantity) FROM billing.usage_events_counted e
                     WHERE e.customer_id = c.customer_id AND e.period = c.period
                       AND e.amount_cents IS NULL AND e.metric = u.metric)
           ) OR EXISTS (
               SELECT 1 FROM billing.usage_events_counted e
               WHERE e.customer_id = c.customer_id AND e.period = c.period AND e.amount_cents IS NULL
                 AND NOT EXISTS (SELECT 1 FROM billing.charge_lines u
                                 WHERE u.charge_id = c.id AND u.kind = 'usage' AND u.metric = e.metric)
           ) AS quantities_differ
    FROM billing.charges c
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(amount_cents), 0)::bigint AS lines_cents,
               coalesce(sum(amount_cents) FILTER (WHERE kind = 'pre_priced'), 0)::bigint AS pre_priced_cents,
               coalesce(sum(amount_cents) FILTER (WHERE kind = 'carried'), 0)::bigint AS carried_cents,
               coalesce(sum(amount_cents) FILTER (WHERE kind = 'usage'), 0)::bigint AS rated_cents
        FROM billing.charge_lines WHERE charge_id = c.id
    ) l
)
SELECT id AS charge_id, customer_id, period, status, currency, events_cents, carried_in_cents, amount_cents,
       stripe_payment_intent_id, stripe_received_cents,
       CASE WHEN lines_cents <> amount_cents OR pre_priced_cents <> events_cents OR carried_cents <> carried_in_cents
                 OR quantities_differ THEN 'ledger_differs_from_charge'
            ELSE 'stripe_differs_from_charge' END AS disagreement,
       rated_cents
FROM charge
WHERE lines_cents <> amount_cents OR pre_priced_cents <> events_cents OR carried_cents <> carried_in_cents
   OR quantities_differ
   OR (status = 'succeeded' AND stripe_received_cents IS NOT NULL AND stripe_received_cents <> amount_cents)
UNION ALL
SELECT NULL, p.customer_id, p.period, p.status, p.currency,
       (SELECT coalesce(sum(e.amount_cents), 0) FROM billing.usage_events_counted e
         WHERE e.customer_id = p.customer_id AND e.period = p.period)::bigint, 0, NULL, NULL, NULL,
       'closed_period_without_charge', NULL
FROM billing.periods p
WHERE p.status = 'closed'
  AND NOT EXISTS (SELECT 1 FROM billing.charges c WHERE c.customer_id = p.customer_id AND c.period = p.period);

COMMENT ON VIEW billing.reconciliation IS
    'A row for every disagreement: a charge whose amount is not the sum of its lines, or whose lines do not match its '
    'period''s events (pre-priced amounts, quantities per metric) and what it carries in; a succeeded charge whose '
    'PaymentIntent Stripe reported with another amount_received; a closed period without a charge. '
    'Empty when the ledger, the charges and Stripe agree.';

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        GRANT SELECT ON billing.usage_event_voids, billing.usage_events_counted, billing.charge_lines,
            billing.charge_line_items TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP VIEW billing.reconciliation;
CREATE VIEW billing.reconciliation AS
WITH charge AS (
    SELECT c.id, c.customer_id, c.period, c.status, c.currency, c.amount_cents, c.carried_in_cents,
           c.stripe_payment_intent_id,
           (SELECT coalesce(sum(e.amount_cents), 0) FROM billing.usage_events e
             WHERE e.customer_id = c.customer_id AND e.period = c.period)::bigint AS events_cents,
           (SELECT (s.payload -> 'data' -> 'object' ->> 'amount_received')::bigint FROM billing.stripe_events s
             WHERE s.type LIKE 'payment_intent.%' AND s.type = 'payment_intent.succeeded'
               AND s.payload -> 'data' -> 'object' ->> 'id' = c.stripe_payment_intent_id
             ORDER BY s.created_at DESC LIMIT 1) AS stripe_received_cents
    FROM billing.charges c
)
SELECT id AS charge_id, customer_id, period, status, currency, events_cents, carried_in_cents, amount_cents,
       stripe_payment_intent_id, stripe_received_cents,
       CASE WHEN events_cents + carried_in_cents <> amount_cents THEN 'ledger_differs_from_charge'
            ELSE 'stripe_differs_from_charge' END AS disagreement
FROM charge
WHERE events_cents + carried_in_cents <> amount_cents
   OR (status = 'succeeded' AND stripe_received_cents IS NOT NULL AND stripe_received_cents <> amount_cents)
UNION ALL
SELECT NULL, p.customer_id, p.period, p.status, p.currency,
       (SELECT coalesce(sum(e.amount_cents), 0) FROM billing.usage_events e
         WHERE e.customer_id = p.customer_id AND e.period = p.period)::bigint, 0, NULL, NULL, NULL,
       'closed_period_without_charge'
FROM billing.periods p
WHERE p.status = 'closed'
  AND NOT EXISTS (SELECT 1 FROM billing.charges c WHERE c.customer_id = p.customer_id AND c.period = p.period);
COMMENT ON VIEW billing.reconciliation IS
    'A row for every disagreement: a charge whose amount is not its period''s events plus what it carries in, '
    'a succeeded charge whose PaymentIntent Stripe reported with another amount_received, a closed period without a charge. '
    'Empty when the ledger, the charges and Stripe agree.';
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        GRANT SELECT ON billing.reconciliation TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd
DROP VIEW billing.charge_line_items;
DROP TABLE billing.charge_lines;
CREATE OR REPLACE VIEW billing.period_totals AS
SELECT p.customer_id, p.period, p.currency, p.status AS period_status, p.starts_at, p.ends_at, p.closes_at,
       p.closed_at, coalesce(t.event_count, 0) AS event_count, coalesce(t.total_cents, 0)::bigint AS total_cents,
       c.id AS charge_id, c.status AS charge_status, c.amount_cents AS charge_amount_cents, c.carried_in_cents
FROM billing.periods p
LEFT JOIN LATERAL (
    SELECT count(*) AS event_count, sum(e.amount_cents) AS total_cents
    FROM billing.usage_events e
    WHERE e.customer_id = p.customer_id AND e.period = p.period
) t ON true
LEFT JOIN billing.charges c ON c.customer_id = p.customer_id AND c.period = p.period;
COMMENT ON VIEW billing.period_totals IS
    'One row per (customer, period): its events'' count and total, and its charge''s status and amount once closed.';
DROP VIEW billing.usage_events_counted;
DROP TABLE billing.usage_event_voids;
