package ledger

import "time"

// PublicPeriod is a billing period as the public API shows it, in its
// answers and in the notifications it sends.
type PublicPeriod struct {
	CustomerID  string     `json:"customer_id"`
	Period      string     `json:"period"`
	Status      string     `json:"status"`
	Currency    string     `json:"currency"`
	EventCount  int64      `json:"event_count"`
	TotalCents  int64      `json:"total_cents"`
	StartsAt    time.Time  `json:"starts_at"`
	EndsAt      time.Time  `json:"ends_at"`
	ClosesAt    time.Time  `json:"closes_at"`
	ClosedAt    *time.Time `json:"closed_at"`
	ChargeJobID *int64     `json:"charge_job_id"`
	// PlanID and PlanVersion price the period: the customer's plan and its
	// version when the period opened; null: none.
	PlanID      *string `json:"plan_id"`
	PlanVersion *int32  `json:"plan_version"`
	Charge      *struct {
		ID     int64  `json:"id"`
		Status string `json:"status"`
	} `json:"charge"`
}

// Public returns p as the public API shows it.
func (p *Period) Public() PublicPeriod {
	resp := PublicPeriod{
		CustomerID: p.CustomerID, Period: p.Period, Status: p.Status, Currency: p.Currency,
		EventCount: p.EventCount, TotalCents: p.TotalCents, StartsAt: p.StartsAt, EndsAt: p.EndsAt,
		ClosesAt: p.ClosesAt, ClosedAt: p.ClosedAt, ChargeJobID: p.ChargeJobID,
		PlanID: p.PlanID, PlanVersion: p.PlanVersion,
	}
	if p.ChargeID != nil {
		resp.Charge = &struct {
			ID     int64  `json:"id"`
			Status string `json:"status"`
		}{*p.ChargeID, *p.ChargeStatus}
	}
	return resp
}
