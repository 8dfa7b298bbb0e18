-- Usage thresholds (GitHub issue 14): a customer's usage_alert_thresholds_cents
-- are levels of a period's running total; when the total crosses one,
-- usage.threshold_reached is sent once per (customer, period, threshold).
--
-- Ingest writes nothing more: a periodic job (jobs.UsageThresholdScanWorker)
-- reads the events ingested since its watermark (usage_threshold_scan, one
-- row), sums the periods they belong to, and records each threshold reached
-- (usage_thresholds_reached, whose key makes it once) with its notification,
-- in one transaction. The watermark starts at the ledger's last event: a
-- period's next event after a threshold is set checks it.

-- +goose Up
ALTER TABLE billing.customers ADD COLUMN usage_alert_thresholds_cents bigint[] NOT NULL DEFAULT '{}'
    CHECK (0 < ALL (usage_alert_thresholds_cents) AND cardinality(usage_alert_thresholds_cents) <= 20);

CREATE TABLE billing.usage_thresholds_reached (
    customer_id     text        NOT NULL,
    period          text        NOT NULL,
    threshold_cents bigint      NOT NULL CHECK (threshold_cents > 0),
    total_cents     bigint      NOT NULL,
    currency        text        NOT NULL,
    reached_at      timestamptz NOT NULL,
    PRIMARY KEY (customer_id, period, threshold_cents),
    FOREIGN KEY (customer_id, period) REFERENCES billing.periods (customer_id, period)
);

CREATE TABLE billing.usage_threshold_scan (
    id            boolean     PRIMARY KEY DEFAULT true CHECK (id),
    last_event_id bigint      NOT NULL,
    scanned_at    timestamptz
);
INSERT INTO billing.usage_threshold_scan (last_event_id)
SELECT coalesce(max(id), 0) FROM billing.usage_events;

-- +goose Down
DROP TABLE billing.usage_threshold_scan;
DROP TABLE billing.usage_thresholds_reached;
ALTER TABLE billing.customers DROP COLUMN usage_alert_thresholds_cents;
