-- Usage roll-ups (GitHub issue 24): what the usage API and the usage
-- thresholds read, so that neither scans a period's events.
--
-- billing.usage_rollups holds, per (customer, period, metric, hour of
-- occurred_at in UTC), the count, quantity and pre-priced amount of the
-- events that count (voids subtract). metric is '' for pre-priced events
-- (amount_cents set; their metric, if any, is a label). A periodic job
-- (jobs.UsageRollupWorker, ledger.UsageRollup) adds the events and voids
-- committed since its watermark, in the transaction that moves the
-- watermark, so each is added exactly once; ingest writes nothing more.
--
-- The watermark (billing.usage_rollup_watermark, one row) is the last event
-- id and void id added. Ids are taken in one order and committed in
-- another, so the job moves it only to ids every transaction that could
-- hold one of them has ended: it notes the sequences' last values
-- (pending_*), then the next transaction id not yet assigned (pending_xid);
-- once no transaction older than that is running, every id up to the
-- pending ones is committed or rolled back for good. That holds because
-- ingest and voids lock their period's row, which assigns their
-- transaction id, before they take an id. The roll-ups lag ingest by about
-- two runs of the job (TALLY_USAGE_ROLLUP_INTERVAL, 2 s), longer while a
-- transaction that began before them is still open.
--
-- The close never reads the roll-ups: it rates the events themselves.
--
-- It replaces the usage threshold scan (00016's usage_threshold_scan): the
-- thresholds are checked against the rated totals the roll-ups give.
--
-- The backfill below reads the ledger under a SHARE lock on the events and
-- voids: ingest and voids wait for it, for a time that grows with the
-- ledger.

-- +goose Up
CREATE TABLE billing.usage_rollups (
    customer_id  text        NOT NULL,
    period       text        NOT NULL,
    metric       text        NOT NULL,
    bucket_start timestamptz NOT NULL CHECK (date_trunc('hour', bucket_start, 'UTC') = bucket_start),
    events       bigint      NOT NULL,
    quantity     numeric     NOT NULL,
    amount_cents bigint      NOT NULL,
    PRIMARY KEY (customer_id, period, metric, bucket_start)
);
CREATE INDEX usage_rollups_series ON billing.usage_rollups (customer_id, metric, bucket_start);

COMMENT ON TABLE billing.usage_rollups IS
    'Usage per (customer, period, metric, hour of occurred_at, UTC): the events that count (voids subtracted), their '
    'quantity and pre-priced amount. metric is '''' for pre-priced events. Kept by the usage_rollup job a few seconds '
    'behind ingest (billing.usage_rollup_watermark.rolled_at); the close rates the events themselves, not this.';

ALTER TABLE billing.usage_event_voids ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY UNIQUE;

CREATE TABLE billing.usage_rollup_watermark (
    one              boolean     PRIMARY KEY DEFAULT true CHECK (one),
    event_id         bigint      NOT NULL,
    void_id          bigint      NOT NULL,
    pending_event_id bigint,
    pending_void_id  bigint,
    pending_xid      xid8,
    rolled_at        timestamptz NOT NULL
);

COMMENT ON TABLE billing.usage_rollup_watermark IS
    'The last event id and void id in billing.usage_rollups, and the ids it moves to once every transaction older '
    'than pending_xid has ended; rolled_at is when it last moved.';

LOCK TABLE billing.usage_events, billing.usage_event_voids IN SHARE MODE;

INSERT INTO billing.usage_rollups (customer_id, period, metric, bucket_start, events, quantity, amount_cents)
SELECT e.customer_id, e.period, CASE WHEN e.amount_cents IS NULL THEN e.metric ELSE '' END,
       date_trunc('hour', e.occurred_at, 'UTC'), count(*), coalesce(sum(e.quantity) FILTER (WHERE e.amount_cents IS NULL), 0),
       coalesce(sum(e.amount_cents), 0)
FROM billing.usage_events_counted e
GROUP BY 1, 2, 3, 4;

INSERT INTO billing.usage_rollup_watermark (event_id, void_id, rolled_at)
SELECT coalesce((SELECT max(id) FROM billing.usage_events), 0),
       coalesce((SELECT max(id) FROM billing.usage_event_voids), 0),
       now();

DROP TABLE billing.usage_threshold_scan;

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        GRANT SELECT ON billing.usage_rollups, billing.usage_rollup_watermark TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
CREATE TABLE billing.usage_threshold_scan (
    id            boolean     PRIMARY KEY DEFAULT true CHECK (id),
    last_event_id bigint      NOT NULL,
    scanned_at    timestamptz
);
INSERT INTO billing.usage_threshold_scan (last_event_id)
SELECT coalesce(max(id), 0) FROM billing.usage_events;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_readonly') THEN
        GRANT SELECT ON billing.usage_threshold_scan TO tally_readonly;
    END IF;
END
$$;
-- +goose StatementEnd
DROP TABLE billing.usage_rollup_watermark;
ALTER TABLE billing.usage_event_voids DROP COLUMN id;
DROP TABLE billing.usage_rollups;
