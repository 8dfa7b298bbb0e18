package ledger

import "time"

// PublicCharge is a charge as the public API shows it, in its answers and in
// the notifications it sends (notification.go). Lease internals stay out.
type PublicCharge struct {
	ID                    int64      `json:"id"`
	CustomerID            string     `json:"customer_id"`
	Period                string     `json:"period"`
	Status                string     `json:"status"`
	AmountCents           int64      `json:"amount_cents"`
	Currency              string     `json:"currency"`
	EventCount            int64      `json:"event_count"`
	CarriedInCents        int64      `json:"carried_in_cents"`
	CarriedInto           *int64     `json:"carried_into"`
	StripeCustomerID      string     `json:"stripe_customer_id"`
	StripePaymentMethodID *string    `json:"stripe_payment_method_id"`
	StripePaymentIntentID *string    `json:"stripe_payment_intent_id"`
	StripeChargeID        *string    `json:"stripe_charge_id"`
	ChargeKey             string     `json:"tally_charge_key"`
	KeyGeneration         int        `json:"key_generation"`
	FailureCode           *string    `json:"failure_code"`
	FailureMessage        *string    `json:"failure_message"`
	HeldReason            *string    `json:"held_reason"`
	HeldDetail            *string    `json:"held_detail"`
	HeldAt                *time.Time `json:"held_at"`
	ApprovedAt            *time.Time `json:"approved_at"`
	LookupRequired        bool       `json:"lookup_required"`
	ResolvedBy            *string    `json:"resolved_by"`
	PastDueSince          *time.Time `json:"past_due_since"`
	NextRetryAt           *time.Time `json:"next_retry_at"`
	DunningRetries        int        `json:"dunning_retries"`
	RetiredPaymentIntents []string   `json:"retired_payment_intent_ids"`
	CancelRequestedAt     *time.Time `json:"cancel_requested_at"`
	CancelRequestedBy     *string    `json:"cancel_requested_by"`
	AttemptCount          int        `json:"attempt_count"`
	FirstAttemptedAt      *time.Time `json:"first_attempted_at"`
	LastAttemptedAt       *time.Time `json:"last_attempted_at"`
	CreatedAt             time.Time  `json:"created_at"`
	UpdatedAt             time.Time  `json:"updated_at"`
}

// Public returns c as the public API shows it.
func (c *Charge) Public() PublicCharge {
	var held *string
	if c.HeldReason != nil {
		held = (*string)(c.HeldReason)
	}
	retired := c.RetiredPaymentIntentIDs
	if retired == nil {
		retired = []string{}
	}
	return PublicCharge{
		ID: c.ID, CustomerID: c.CustomerID, Period: c.Period, Status: string(c.Status), AmountCents: c.AmountCents,
		Currency: c.Currency, EventCount: c.EventCount, CarriedInCents: c.CarriedInCents, CarriedInto: c.CarriedInto,
		StripeCustomerID:      c.StripeCustomerID,
		StripePaymentMethodID: c.StripePaymentMethodID, StripePaymentIntentID: c.StripePaymentIntentID,
		StripeChargeID: c.StripeChargeID, ChargeKey: c.ChargeKey, KeyGeneration: c.KeyGeneration,
		FailureCode: c.FailureCode, FailureMessage: c.FailureMessage, HeldReason: held,
		HeldDetail: c.HeldDetail, HeldAt: c.HeldAt, ApprovedAt: c.ApprovedAt, LookupRequired: c.LookupRequired,
		ResolvedBy: c.ResolvedBy, PastDueSince: c.PastDueSince, NextRetryAt: c.NextRetryAt, DunningRetries: c.DunningRetries,
		RetiredPaymentIntents: retired, CancelRequestedAt: c.CancelRequestedAt, CancelRequestedBy: c.CancelRequestedBy, AttemptCount: c.AttemptCount, FirstAttemptedAt: c.FirstAttemptedAt,
		LastAttemptedAt: c.LastAttemptedAt, CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt,
	}
}
