-- The anomaly guard reads a customer's last succeeded charges on every
-- first claim. Without this index, a plan chosen before statistics ANDed the
-- customer's index with charges_status_idx, whose 'succeeded' range holds
-- every succeeded charge of every customer: a claim cost O(all charges).

-- +goose Up
CREATE INDEX charges_customer_succeeded_idx ON billing.charges (customer_id, period_starts_at DESC, id DESC)
    WHERE status = 'succeeded';

-- +goose Down
DROP INDEX billing.charges_customer_succeeded_idx;
