-- Exits (GitHub issue 22).
--
-- A charge for which Stripe has no payment method (the customer has none
-- registered in Tally and no default on Stripe) waits for one instead of
-- failing for good: past_due under the dunning schedule, or, with dunning
-- off, held no_payment_method until an operator approves it once a card is
-- added.
--
-- An operator may cancel a past_due charge (the customer left, the debt is
-- written off): the request is recorded on the charge (cancel_requested_*)
-- and carried out by its charge job, through the same claim, lease and kill
-- switch as a retry: it cancels on Stripe every PaymentIntent of the charge
-- that could still succeed, then moves the charge to canceled. A
-- PaymentIntent found paid meanwhile settles the charge instead.

-- +goose Up
ALTER TABLE billing.charges DROP CONSTRAINT charges_held_reason_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_held_reason_check CHECK (held_reason IN (
    'over_customer_cap', 'over_period_budget', 'anomaly', 'idempotency_error',
    'payment_intent_mismatch', 'double_charge', 'unexpected_status', 'amount_too_large', 'no_payment_method'));

ALTER TABLE billing.charges ADD COLUMN cancel_requested_at timestamptz;
ALTER TABLE billing.charges ADD COLUMN cancel_requested_by text;
ALTER TABLE billing.charges ADD COLUMN cancel_reason text;
ALTER TABLE billing.charges ADD CONSTRAINT charges_cancel_request_check
    CHECK ((cancel_requested_at IS NULL) = (cancel_requested_by IS NULL)
       AND (cancel_requested_at IS NULL) = (cancel_reason IS NULL));

COMMENT ON COLUMN billing.charges.cancel_requested_at IS
    'When an operator asked to cancel this past_due charge; its charge job cancels its PaymentIntents on Stripe, '
    'then the charge (unless one of them was paid meanwhile).';
COMMENT ON COLUMN billing.charges.cancel_requested_by IS 'Who asked to cancel the past_due charge (operator:…, cli:…).';
COMMENT ON COLUMN billing.charges.cancel_reason IS 'Why, as the operator said (also in billing.operator_actions).';

INSERT INTO billing.charge_status_transitions (from_status, to_status) VALUES ('past_due', 'canceled');

-- +goose Down
DELETE FROM billing.charge_status_transitions WHERE from_status = 'past_due' AND to_status = 'canceled';
ALTER TABLE billing.charges DROP CONSTRAINT charges_cancel_request_check;
ALTER TABLE billing.charges DROP COLUMN cancel_reason;
ALTER TABLE billing.charges DROP COLUMN cancel_requested_by;
ALTER TABLE billing.charges DROP COLUMN cancel_requested_at;
ALTER TABLE billing.charges DROP CONSTRAINT charges_held_reason_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_held_reason_check CHECK (held_reason IN (
    'over_customer_cap', 'over_period_budget', 'anomaly', 'idempotency_error',
    'payment_intent_mismatch', 'double_charge', 'unexpected_status', 'amount_too_large'));
