package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// usageBody is GET /v1/customers/{id}/usage's answer.
type usageBody struct {
	Period      string  `json:"period"`
	Status      string  `json:"status"`
	Currency    string  `json:"currency"`
	PlanID      *string `json:"plan_id"`
	PlanVersion *int32  `json:"plan_version"`
	Metrics     []struct {
		Metric      string `json:"metric"`
		EventCount  int64  `json:"event_count"`
		Quantity    string `json:"quantity"`
		Model       string `json:"model"`
		ExactAmount string `json:"exact_amount"`
		AmountCents int64  `json:"amount_cents"`
	} `json:"metrics"`
	PrePriced struct {
		EventCount  int64 `json:"event_count"`
		AmountCents int64 `json:"amount_cents"`
	} `json:"pre_priced"`
	CarriedInCents int64     `json:"carried_in_cents"`
	ProjectedCents int64     `json:"projected_cents"`
	ChargeID       *int64    `json:"charge_id"`
	AsOf           time.Time `json:"as_of"`
}

// seriesBody is GET /v1/customers/{id}/usage/series's answer.
type seriesBody struct {
	Metric      *string   `json:"metric"`
	Granularity string    `json:"granularity"`
	From        time.Time `json:"from"`
	To          time.Time `json:"to"`
	Buckets     []struct {
		Start       time.Time `json:"start"`
		EventCount  int64     `json:"event_count"`
		Quantity    *string   `json:"quantity"`
		AmountCents *int64    `json:"amount_cents"`
	} `json:"buckets"`
}

func TestCustomerUsage(t *testing.T) {
	t.Parallel()

	t.Run("RatedFromTheRollups", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onPlan(t)

		rec := b.do(http.MethodGet, "/v1/customers/acme/usage", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		u := decodeJSON[usageBody](t, rec)
		require.Equal(t, "2026-11", u.Period, "the open period, without events yet")
		require.Equal(t, "open", u.Status)
		require.Equal(t, "std", *u.PlanID, "the plan it would open with")
		require.Empty(t, u.Metrics)
		require.Zero(t, u.ProjectedCents)

		for _, body := range []string{
			`{"customer_id":"acme","event_id":"q1","metric":"api_calls","quantity":"10.5"}`,
			`{"customer_id":"acme","event_id":"q2","metric":"api_calls","quantity":"2"}`,
			`{"customer_id":"acme","event_id":"q3","metric":"api_calls","quantity":"1"}`,
			eventJSON("p1", 40),
		} {
			require.Equal(t, http.StatusCreated, b.postEvent(body).Code)
		}
		rec = b.do(http.MethodPost, "/v1/usage-events/void", `{"customer_id":"acme","event_id":"q3","reason":"sent twice"}`)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		b.Rollup(t, ctx)

		u = decodeJSON[usageBody](t, b.do(http.MethodGet, "/v1/customers/acme/usage?period=2026-11", ""))
		require.Len(t, u.Metrics, 1)
		m := u.Metrics[0]
		require.Equal(t, "api_calls", m.Metric)
		require.Equal(t, int64(2), m.EventCount, "the void nets out")
		require.Equal(t, "12.5", m.Quantity)
		require.Equal(t, "per_unit", m.Model)
		require.Equal(t, "6.25", m.ExactAmount)
		require.Equal(t, int64(6), m.AmountCents)
		require.Equal(t, int64(1), u.PrePriced.EventCount)
		require.Equal(t, int64(40), u.PrePriced.AmountCents)
		require.Equal(t, int64(46), u.ProjectedCents)
		require.Nil(t, u.ChargeID)
		require.Equal(t, int32(1), *u.PlanVersion)
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.do(http.MethodGet, "/v1/customers/acme/usage?period=nov", ""), "period")
		requireProblem(t, b.do(http.MethodGet, "/v1/customers/nobody/usage", ""), http.StatusNotFound, "not_found")
	})
}

func TestCustomerUsageSeries(t *testing.T) {
	t.Parallel()

	t.Run("DenseBuckets", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.onPlan(t)
		for _, body := range []string{
			`{"customer_id":"acme","event_id":"q1","metric":"api_calls","quantity":"3","occurred_at":"2026-11-14T08:10:00Z"}`,
			`{"customer_id":"acme","event_id":"q2","metric":"api_calls","quantity":"4","occurred_at":"2026-11-14T08:50:00Z"}`,
			`{"customer_id":"acme","event_id":"q3","metric":"api_calls","quantity":"5","occurred_at":"2026-11-14T10:00:00Z"}`,
			`{"customer_id":"acme","event_id":"p1","amount_cents":70,"occurred_at":"2026-11-13T23:00:00Z"}`,
		} {
			rec := b.postEvent(body)
			require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		}
		b.Rollup(t, ctx)

		rec := b.do(http.MethodGet, "/v1/customers/acme/usage/series?metric=api_calls&granularity=hour&from=2026-11-14T07:30:00Z&to=2026-11-14T10:00:01Z", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		s := decodeJSON[seriesBody](t, rec)
		require.True(t, s.From.Equal(time.Date(2026, 11, 14, 7, 0, 0, 0, time.UTC)), "from truncated to the hour")
		require.True(t, s.To.Equal(time.Date(2026, 11, 14, 11, 0, 0, 0, time.UTC)), "to rounded up")
		var got []string
		for _, bk := range s.Buckets {
			got = append(got, bk.Start.Format("15")+" "+*bk.Quantity)
		}
		require.Equal(t, []string{"07 0", "08 7", "09 0", "10 5"}, got)

		s = decodeJSON[seriesBody](t, b.do(http.MethodGet, "/v1/customers/acme/usage/series?from=2026-11-13T00:00:00Z&to=2026-11-15T00:00:00Z", ""))
		require.Nil(t, s.Metric, "without metric: the pre-priced events")
		require.Equal(t, "day", s.Granularity)
		require.Len(t, s.Buckets, 2)
		require.Equal(t, int64(70), *s.Buckets[0].AmountCents)
		require.Equal(t, int64(0), *s.Buckets[1].AmountCents)

		s = decodeJSON[seriesBody](t, b.do(http.MethodGet, "/v1/customers/acme/usage/series?metric=api_calls", ""))
		require.Len(t, s.Buckets, 30, "default: the open period, by day")
		require.Equal(t, "12", *s.Buckets[13].Quantity)
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		p := requireInvalid(t, b.do(http.MethodGet, "/v1/customers/acme/usage/series?granularity=week&from=yesterday", ""), "granularity")
		require.Contains(t, p.Errors["from"], "RFC 3339")
		p = requireInvalid(t, b.do(http.MethodGet, "/v1/customers/acme/usage/series?granularity=hour&from=2026-01-01T00:00:00Z&to=2026-12-01T00:00:00Z", ""), "to")
		require.Contains(t, p.Errors["to"], "at most 1000")
		requireInvalid(t, b.do(http.MethodGet, "/v1/customers/acme/usage/series?from=2026-11-02T00:00:00Z&to=2026-11-01T00:00:00Z", ""), "to")
		requireProblem(t, b.do(http.MethodGet, "/v1/customers/nobody/usage/series", ""), http.StatusNotFound, "not_found")
	})
}
