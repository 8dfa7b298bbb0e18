-- The state gauges (tally_charges, tally_outbox_lag_seconds, ...) are one
-- snapshot shared by every replica: one replica takes it per interval, under a
-- transaction-level advisory lock, and the others read this row. Reading the
-- state costs the same with one replica as with fifty.

-- +goose Up
CREATE TABLE billing.operations_snapshot (
    id       smallint    PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    state    jsonb       NOT NULL,
    taken_at timestamptz NOT NULL
);

COMMENT ON TABLE billing.operations_snapshot IS
    'One row: the work in flight as the metrics gauges last read it (charges by status, held '
    'reasons, oldest overdue close, outbox lag, River jobs), taken by one replica per '
    'TALLY_METRICS_STATE_INTERVAL and read by all.';

-- +goose Down
DROP TABLE billing.operations_snapshot;
