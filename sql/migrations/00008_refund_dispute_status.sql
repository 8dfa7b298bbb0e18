-- Refund and dispute status changes, and the bookmark of the Stripe event
-- sweep.
--
-- billing.refunds and billing.disputes keep one immutable row per Stripe
-- refund or dispute, as Tally first saw it. Its status changes afterwards
-- (a pending refund succeeds or fails, a succeeded card refund can still
-- fail; a dispute goes under review and is won or lost), so every status
-- Tally sees — each webhook event about the object, or Tally's own API call
-- — is appended to billing.refund_events or billing.dispute_events, at most
-- once per (object, Stripe event). Both are append-only.
--
-- billing.refunds_current and billing.disputes_current give each object's
-- current status. Webhooks arrive duplicated and out of order, and the
-- objects carry no "updated" timestamp (event.created has one-second
-- resolution), so the current row is the one with the highest status rank
-- (billing.refund_status_rank, billing.dispute_status_rank: Stripe's status
-- machines, each status ranked after every status it can come from), then
-- the latest event.created, then the latest recorded. A late or replayed
-- event can therefore never move an object backwards: a pending refund that
-- succeeded stays succeeded when the old refund.created comes again, a lost
-- dispute stays lost when an earlier charge.dispute.updated arrives last.
--
-- billing.stripe_events.stuck_alerted_at is when the sweep last reported an
-- event as stuck (ALERT stripe_event_stuck), so it reports each at most once
-- an hour.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION billing.refund_status_rank(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE status
        WHEN 'requires_action' THEN 1
        WHEN 'pending'         THEN 1
        WHEN 'succeeded'       THEN 2
        WHEN 'failed'          THEN 3
        WHEN 'canceled'        THEN 3
        ELSE 0
    END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION billing.refund_status_rank(text) IS
    'Order of Stripe refund statuses: requires_action, pending < succeeded < failed, canceled (a succeeded '
    'card refund can still fail). Unknown statuses rank 0. billing.refunds_current shows the highest.';

-- +goose StatementBegin
CREATE FUNCTION billing.dispute_status_rank(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE status
        WHEN 'warning_needs_response' THEN 1
        WHEN 'warning_under_review'   THEN 2
        WHEN 'needs_response'         THEN 3
        WHEN 'under_review'           THEN 4
        WHEN 'won'                    THEN 5
        WHEN 'lost'                   THEN 5
        WHEN 'warning_closed'         THEN 5
        WHEN 'charge_refunded'        THEN 5
        ELSE 0
    END
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION billing.dispute_status_rank(text) IS
    'Order of Stripe dispute statuses: warning_needs_response < warning_under_review < needs_response '
    '< under_review < won, lost, warning_closed, charge_refunded (closed). Unknown statuses rank 0. '
    'billing.disputes_current shows the highest.';

CREATE TABLE billing.refund_events (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stripe_refund_id  text        NOT NULL REFERENCES billing.refunds (stripe_refund_id),
    status            text        NOT NULL CHECK (octet_length(status) BETWEEN 1 AND 64),
    failure_reason    text,
    stripe_event_id   text,
    stripe_event_type text,
    observed_at       timestamptz NOT NULL,
    recorded_at       timestamptz NOT NULL
);

COMMENT ON TABLE billing.refund_events IS
    'Append-only: every status Tally saw for a refund, one row per (refund, Stripe event). '
    'stripe_event_id is NULL for what Tally''s own API call answered (a resolve''s refund). '
    'observed_at is Stripe''s clock: event.created, or the refund''s created for an API answer.';

CREATE UNIQUE INDEX refund_events_event_key ON billing.refund_events (stripe_refund_id, (coalesce(stripe_event_id, '')));
CREATE TRIGGER refund_events_append_only
    BEFORE UPDATE OR DELETE ON billing.refund_events
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER refund_events_no_truncate
    BEFORE TRUNCATE ON billing.refund_events
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

CREATE TABLE billing.dispute_events (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stripe_dispute_id text        NOT NULL REFERENCES billing.disputes (stripe_dispute_id),
    status            text        NOT NULL CHECK (octet_length(status) BETWEEN 1 AND 64),
    amount_cents      bigint      NOT NULL CHECK (amount_cents >= 0),
    evidence_due_by   timestamptz,
    stripe_event_id   text,
    stripe_event_type text,
    observed_at       timestamptz NOT NULL,
    recorded_at       timestamptz NOT NULL
);

COMMENT ON TABLE billing.dispute_events IS
    'Append-only: every status Tally saw for a dispute, one row per (dispute, Stripe event), '
    'including charge.dispute.funds_withdrawn and funds_reinstated. observed_at is event.created.';

CREATE UNIQUE INDEX dispute_events_event_key ON billing.dispute_events (stripe_dispute_id, (coalesce(stripe_event_id, '')));
CREATE TRIGGER dispute_events_append_only
    BEFORE UPDATE OR DELETE ON billing.dispute_events
    FOR EACH ROW EXECUTE FUNCTION billing.reject_mutation();
CREATE TRIGGER dispute_events_no_truncate
    BEFORE TRUNCATE ON billing.dispute_events
    FOR EACH STATEMENT EXECUTE FUNCTION billing.reject_mutation();

-- What was recorded before this migration is each object's first status.
INSERT INTO billing.refund_events (stripe_refund_id, status, stripe_event_id, stripe_event_type, observed_at, recorded_at)
SELECT r.stripe_refund_id, r.status, r.stripe_event_id, e.type, coalesce(e.created_at, r.stripe_created_at), r.recorded_at
FROM billing.refunds r LEFT JOIN billing.stripe_events e ON e.id = r.stripe_event_id
WHERE r.status IS NOT NULL AND r.status <> '';

INSERT INTO billing.dispute_events (stripe_dispute_id, status, amount_cents, stripe_event_id, stripe_event_type, observed_at, recorded_at)
SELECT d.stripe_dispute_id, d.status, d.amount_cents, d.stripe_event_id, e.type, coalesce(e.created_at, d.stripe_created_at), d.recorded_at
FROM billing.disputes d LEFT JOIN billing.stripe_events e ON e.id = d.stripe_event_id
WHERE d.status IS NOT NULL AND d.status <> '';

CREATE VIEW billing.refunds_current AS
SELECT r.stripe_refund_id, r.charge_id, r.stripe_charge_id, r.stripe_payment_intent_id, r.amount_cents, r.currency,
       r.reason, r.stripe_created_at, r.recorded_at AS first_recorded_at,
       coalesce(s.status, r.status) AS status, s.failure_reason,
       s.stripe_event_id AS status_event_id, s.stripe_event_type AS status_event_type,
       s.observed_at AS status_observed_at, coalesce(s.recorded_at, r.recorded_at) AS status_recorded_at
FROM billing.refunds r
LEFT JOIN LATERAL (
    SELECT e.status, e.failure_reason, e.stripe_event_id, e.stripe_event_type, e.observed_at, e.recorded_at
    FROM billing.refund_events e
    WHERE e.stripe_refund_id = r.stripe_refund_id
    ORDER BY billing.refund_status_rank(e.status) DESC, e.observed_at DESC, e.id DESC
    LIMIT 1
) s ON true;

COMMENT ON VIEW billing.refunds_current IS
    'One row per refund with its current status: the highest-ranked status seen '
    '(billing.refund_status_rank), then the latest event.created, then the latest recorded.';

CREATE VIEW billing.disputes_current AS
SELECT d.stripe_dispute_id, d.charge_id, d.stripe_charge_id, d.stripe_payment_intent_id,
       coalesce(s.amount_cents, d.amount_cents) AS amount_cents, d.currency, d.reason, d.stripe_created_at,
       d.recorded_at AS first_recorded_at,
       coalesce(s.status, d.status) AS status, s.evidence_due_by,
       s.stripe_event_id AS status_event_id, s.stripe_event_type AS status_event_type,
       s.observed_at AS status_observed_at, coalesce(s.recorded_at, d.recorded_at) AS status_recorded_at,
       (SELECT min(w.observed_at) FROM billing.dispute_events w
         WHERE w.stripe_dispute_id = d.stripe_dispute_id
           AND w.stripe_event_type = 'charge.dispute.funds_withdrawn') AS funds_withdrawn_at,
       (SELECT min(w.observed_at) FROM billing.dispute_events w
         WHERE w.stripe_dispute_id = d.stripe_dispute_id
           AND w.stripe_event_type = 'charge.dispute.funds_reinstated') AS funds_reinstated_at
FROM billing.disputes d
LEFT JOIN LATERAL (
    SELECT e.status, e.amount_cents, e.evidence_due_by, e.stripe_event_id, e.stripe_event_type, e.observed_at, e.recorded_at
    FROM billing.dispute_events e
    WHERE e.stripe_dispute_id = d.stripe_dispute_id
    ORDER BY billing.dispute_status_rank(e.status) DESC, e.observed_at DESC, e.id DESC
    LIMIT 1
) s ON true;

COMMENT ON VIEW billing.disputes_current IS
    'One row per dispute with its current status: the highest-ranked status seen '
    '(billing.dispute_status_rank), then the latest event.created, then the latest recorded; '
    'funds_withdrawn_at / funds_reinstated_at from charge.dispute.funds_withdrawn / funds_reinstated.';

ALTER TABLE billing.stripe_events ADD COLUMN stuck_alerted_at timestamptz;

COMMENT ON COLUMN billing.stripe_events.stuck_alerted_at IS
    'When the sweep last logged ALERT stripe_event_stuck for this event (at most once an hour).';

-- +goose Down
ALTER TABLE billing.stripe_events DROP COLUMN stuck_alerted_at;
DROP VIEW billing.disputes_current;
DROP VIEW billing.refunds_current;
DROP TABLE billing.dispute_events;
DROP TABLE billing.refund_events;
DROP FUNCTION billing.dispute_status_rank(text);
DROP FUNCTION billing.refund_status_rank(text);
