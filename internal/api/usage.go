package api

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
)

// usageResponse is GET /v1/customers/{id}/usage: a period's usage so far,
// rated, from the roll-ups (as_of says how fresh).
type usageResponse struct {
	CustomerID     string         `json:"customer_id"`
	Period         string         `json:"period"`
	StartsAt       time.Time      `json:"starts_at"`
	EndsAt         time.Time      `json:"ends_at"`
	Status         string         `json:"status"`
	Currency       string         `json:"currency"`
	PlanID         *string        `json:"plan_id"`
	PlanVersion    *int32         `json:"plan_version"`
	Metrics        []metricUsage  `json:"metrics"`
	PrePriced      prePricedUsage `json:"pre_priced"`
	CarriedInCents int64          `json:"carried_in_cents"`
	ProjectedCents int64          `json:"projected_cents"`
	ChargeID       *int64         `json:"charge_id"`
	AsOf           time.Time      `json:"as_of"`
}

// metricUsage is one metric's quantity so far and what it is rated at.
type metricUsage struct {
	Metric      string `json:"metric"`
	EventCount  int64  `json:"event_count"`
	Quantity    string `json:"quantity"`
	Model       string `json:"model"`
	ExactAmount string `json:"exact_amount"`
	AmountCents int64  `json:"amount_cents"`
}

// prePricedUsage is the events sent with amount_cents.
type prePricedUsage struct {
	EventCount  int64 `json:"event_count"`
	AmountCents int64 `json:"amount_cents"`
}

// handleCustomerUsage answers a period's usage so far (?period=, default
// the open one).
func handleCustomerUsage(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := newQueryParams(r.URL)
		period := q.str("period")
		if err := q.err(); err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		u, err := l.CustomerUsageGet(r.Context(), r.PathValue("customer_id"), period)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := usageResponse{CustomerID: u.CustomerID, Period: u.Period.Label, StartsAt: u.Period.StartsAt,
			EndsAt: u.Period.EndsAt, Status: u.Status, Currency: u.Currency, PlanID: u.PlanID, PlanVersion: u.PlanVersion,
			Metrics:        make([]metricUsage, 0, len(u.Metrics)),
			PrePriced:      prePricedUsage{EventCount: u.PrePricedEvents, AmountCents: u.PrePricedCents},
			CarriedInCents: u.CarriedCents, ProjectedCents: u.ProjectedCents, ChargeID: u.ChargeID, AsOf: u.AsOf}
		for _, m := range u.Metrics {
			resp.Metrics = append(resp.Metrics, metricUsage{Metric: m.Metric, EventCount: m.Events,
				Quantity: pricing.Text(&m.Quantity), Model: m.Model, ExactAmount: pricing.Text(&m.ExactAmount), AmountCents: m.AmountCents})
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}

// usageSeriesResponse is GET /v1/customers/{id}/usage/series.
type usageSeriesResponse struct {
	CustomerID  string        `json:"customer_id"`
	Metric      *string       `json:"metric"`
	Granularity string        `json:"granularity"`
	From        time.Time     `json:"from"`
	To          time.Time     `json:"to"`
	Buckets     []usageBucket `json:"buckets"`
	AsOf        time.Time     `json:"as_of"`
}

// usageBucket is one hour or day: a metric's events and quantity, or the
// pre-priced events and their amount.
type usageBucket struct {
	Start       time.Time `json:"start"`
	EventCount  int64     `json:"event_count"`
	Quantity    *string   `json:"quantity,omitempty"`
	AmountCents *int64    `json:"amount_cents,omitempty"`
}

// handleCustomerUsageSeries answers a metric's (or, without metric, the
// pre-priced events') usage per hour or day, every bucket of [from, to).
func handleCustomerUsageSeries(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := newQueryParams(r.URL)
		p := ledger.UsageSeriesParams{CustomerID: r.PathValue("customer_id"), Metric: q.str("metric"),
			Granularity: q.str("granularity"), From: q.time("from"), To: q.time("to")}
		if g := p.Granularity; g != "" && g != ledger.GranularityHour && g != ledger.GranularityDay {
			q.fields["granularity"] = "must be hour or day"
		}
		if err := q.err(); err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		s, err := l.CustomerUsageSeries(r.Context(), p)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := usageSeriesResponse{CustomerID: s.CustomerID, Granularity: s.Granularity, From: s.From, To: s.To,
			Buckets: make([]usageBucket, 0, len(s.Buckets)), AsOf: s.AsOf}
		if s.Metric != "" {
			resp.Metric = &s.Metric
		}
		for _, b := range s.Buckets {
			out := usageBucket{Start: b.Start, EventCount: b.Events}
			if s.Metric != "" {
				qty := pricing.Text(&b.Quantity)
				out.Quantity = &qty
			} else {
				cents := b.AmountCents
				out.AmountCents = &cents
			}
			resp.Buckets = append(resp.Buckets, out)
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}
