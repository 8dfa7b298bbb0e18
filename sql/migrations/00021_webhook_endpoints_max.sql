-- At most 16 webhook endpoints (not deleted; a disabled one counts) per
-- deployment (GitHub issue 22): every notification is written once per
-- endpoint in the transaction of the change it reports, a charge's
-- included, so the fan-out stays small. The ledger refuses a 17th with a
-- 422 naming the limit (WebhookEndpointsMax in
-- internal/ledger/webhook_endpoint.go, which must say the same number);
-- this trigger makes the limit hold when creations run concurrently: each
-- takes a transaction-level advisory lock before it counts, so the second
-- of two waits for the first to commit and, in Tally's READ COMMITTED
-- transactions, counts its row. A deployment with more endpoints already
-- keeps them, and adds none until it has fewer than 16.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION billing.webhook_endpoints_max() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    live bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('tally.webhook_endpoints', 0));
    SELECT count(*) INTO live FROM billing.webhook_endpoints WHERE deleted_at IS NULL AND id <> NEW.id;
    IF live >= 16 THEN
        RAISE EXCEPTION 'billing.webhook_endpoints: % endpoints exist, the most a deployment may have is 16', live
            USING ERRCODE = 'check_violation', CONSTRAINT = 'webhook_endpoints_max',
                  HINT = 'delete an endpoint first';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER webhook_endpoints_max
    BEFORE INSERT ON billing.webhook_endpoints
    FOR EACH ROW WHEN (NEW.deleted_at IS NULL) EXECUTE FUNCTION billing.webhook_endpoints_max();

CREATE TRIGGER webhook_endpoints_max_undelete
    BEFORE UPDATE OF deleted_at ON billing.webhook_endpoints
    FOR EACH ROW WHEN (OLD.deleted_at IS NOT NULL AND NEW.deleted_at IS NULL)
    EXECUTE FUNCTION billing.webhook_endpoints_max();

-- +goose Down
DROP TRIGGER webhook_endpoints_max_undelete ON billing.webhook_endpoints;
DROP TRIGGER webhook_endpoints_max ON billing.webhook_endpoints;
DROP FUNCTION billing.webhook_endpoints_max();
