-- Exits (GitHub issue 22).
--
-- A charge for which Stripe has no payment method (the customer has none
-- registered in Tally and no default on Stripe) waits for one instead of
-- failing for good: past_due under the dunning schedule, or, with dunning
-- off, held no_payment_method until an operator approves it once a card is
-- added.

-- +goose Up
ALTER TABLE billing.charges DROP CONSTRAINT charges_held_reason_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_held_reason_check CHECK (held_reason IN (
    'over_customer_cap', 'over_period_budget', 'anomaly', 'idempotency_error',
    'payment_intent_mismatch', 'double_charge', 'unexpected_status', 'amount_too_large', 'no_payment_method'));

-- +goose Down
ALTER TABLE billing.charges DROP CONSTRAINT charges_held_reason_check;
ALTER TABLE billing.charges ADD CONSTRAINT charges_held_reason_check CHECK (held_reason IN (
    'over_customer_cap', 'over_period_budget', 'anomaly', 'idempotency_error',
    'payment_intent_mismatch', 'double_charge', 'unexpected_status', 'amount_too_large'));
