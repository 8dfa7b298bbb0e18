-- Notifications and their webhook deliveries and attempts in the shape a
-- sharded Postgres (Citus) requires of a table distributed by customer_id
-- (docs/scaling.md, "Distributed by customer_id (Citus): a plan";
-- TestCitusShape): each row names the customer it reports on, and every key
-- and foreign key among them includes customer_id. Every notification
-- reports on one customer's object (a charge, a period, a top-up, a grant,
-- a threshold, a low balance), whose public form carries customer_id: the
-- rows written before are filled from their body. Key columns stay first,
-- so a look-up by id descends the same index.

-- +goose Up
ALTER TABLE billing.notifications ADD COLUMN customer_id text;
UPDATE billing.notifications SET customer_id = body -> 'data' -> 'object' ->> 'customer_id';
ALTER TABLE billing.notifications ALTER COLUMN customer_id SET NOT NULL;
COMMENT ON COLUMN billing.notifications.customer_id IS 'The customer whose object the notification reports on.';

ALTER TABLE billing.webhook_deliveries ADD COLUMN customer_id text;
UPDATE billing.webhook_deliveries d SET customer_id = n.customer_id FROM billing.notifications n WHERE n.id = d.notification_id;
ALTER TABLE billing.webhook_deliveries ALTER COLUMN customer_id SET NOT NULL;
COMMENT ON COLUMN billing.webhook_deliveries.customer_id IS 'The notification''s customer.';

ALTER TABLE billing.webhook_attempts ADD COLUMN customer_id text;
UPDATE billing.webhook_attempts a SET customer_id = d.customer_id FROM billing.webhook_deliveries d WHERE d.id = a.delivery_id;
ALTER TABLE billing.webhook_attempts ALTER COLUMN customer_id SET NOT NULL;
COMMENT ON COLUMN billing.webhook_attempts.customer_id IS 'The delivery''s customer.';

ALTER TABLE billing.webhook_attempts DROP CONSTRAINT webhook_attempts_delivery_id_fkey;
ALTER TABLE billing.webhook_deliveries DROP CONSTRAINT webhook_deliveries_notification_id_fkey;
ALTER TABLE billing.notifications
    DROP CONSTRAINT notifications_pkey,
    ADD CONSTRAINT notifications_pkey PRIMARY KEY (id, customer_id);
ALTER TABLE billing.webhook_deliveries
    DROP CONSTRAINT webhook_deliveries_pkey,
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id, customer_id),
    DROP CONSTRAINT webhook_deliveries_notification_id_endpoint_id_key,
    ADD CONSTRAINT webhook_deliveries_notification_id_endpoint_id_key UNIQUE (notification_id, endpoint_id, customer_id),
    ADD CONSTRAINT webhook_deliveries_notification_id_fkey FOREIGN KEY (notification_id, customer_id)
        REFERENCES billing.notifications (id, customer_id);
ALTER TABLE billing.webhook_attempts
    DROP CONSTRAINT webhook_attempts_pkey,
    ADD CONSTRAINT webhook_attempts_pkey PRIMARY KEY (delivery_id, attempt, customer_id),
    ADD CONSTRAINT webhook_attempts_delivery_id_fkey FOREIGN KEY (delivery_id, customer_id)
        REFERENCES billing.webhook_deliveries (id, customer_id);

-- +goose Down
ALTER TABLE billing.webhook_attempts
    DROP CONSTRAINT webhook_attempts_delivery_id_fkey,
    DROP CONSTRAINT webhook_attempts_pkey,
    ADD CONSTRAINT webhook_attempts_pkey PRIMARY KEY (delivery_id, attempt);
ALTER TABLE billing.webhook_deliveries
    DROP CONSTRAINT webhook_deliveries_notification_id_fkey,
    DROP CONSTRAINT webhook_deliveries_notification_id_endpoint_id_key,
    ADD CONSTRAINT webhook_deliveries_notification_id_endpoint_id_key UNIQUE (notification_id, endpoint_id),
    DROP CONSTRAINT webhook_deliveries_pkey,
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id);
ALTER TABLE billing.notifications
    DROP CONSTRAINT notifications_pkey,
    ADD CONSTRAINT notifications_pkey PRIMARY KEY (id);
ALTER TABLE billing.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_notification_id_fkey FOREIGN KEY (notification_id) REFERENCES billing.notifications (id);
ALTER TABLE billing.webhook_attempts
    ADD CONSTRAINT webhook_attempts_delivery_id_fkey FOREIGN KEY (delivery_id) REFERENCES billing.webhook_deliveries (id);
ALTER TABLE billing.webhook_attempts DROP COLUMN customer_id;
ALTER TABLE billing.webhook_deliveries DROP COLUMN customer_id;
ALTER TABLE billing.notifications DROP COLUMN customer_id;
