package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// periodBody is a billing period as the API answers it.
type periodBody struct {
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
	PlanID      *string    `json:"plan_id"`
	PlanVersion *int32     `json:"plan_version"`
}

func TestPeriodGet(t *testing.T) {
	t.Parallel()

	t.Run("Closed", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("e1", 100)).Code)
		_, err := b.Pool.Exec(ctx, `UPDATE billing.periods SET status = 'closed', closed_at = now()`)
		require.NoError(t, err)

		rec := b.do(http.MethodGet, "/v1/customers/acme/periods/2026-11", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		p := decodeJSON[periodBody](t, rec)
		require.Equal(t, "closed", p.Status)
		require.NotNil(t, p.ClosedAt)
		require.Equal(t, int64(1), p.EventCount)
	})

	t.Run("Found", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("e1", 100)).Code)
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("e2", 250)).Code)
		require.Equal(t, http.StatusOK, b.postEvent(eventJSON("e2", 250)).Code, "a replay is not counted twice")

		rec := b.do(http.MethodGet, "/v1/customers/acme/periods/2026-11", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		p := decodeJSON[periodBody](t, rec)
		require.Equal(t, "acme", p.CustomerID)
		require.Equal(t, "2026-11", p.Period)
		require.Equal(t, "open", p.Status)
		require.Equal(t, "usd", p.Currency)
		require.Equal(t, int64(2), p.EventCount)
		require.Equal(t, int64(350), p.TotalCents)
		require.True(t, p.StartsAt.Equal(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)))
		require.True(t, p.EndsAt.Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)))
		require.True(t, p.ClosesAt.Equal(time.Date(2026, 12, 1, 1, 0, 0, 0, time.UTC)))
		require.Nil(t, p.ClosedAt)
		require.NotNil(t, p.ChargeJobID)
		require.Equal(t, *p.ChargeJobID, b.Count(t, "SELECT id FROM river.river_job WHERE kind = 'charge_period'"))
	})

	t.Run("MalformedLabel", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, label := range []string{"2026-13", "2026-11-14", "nov", "2026-1", "2026-11%20"} {
			p := requireInvalid(t, b.do(http.MethodGet, "/v1/customers/acme/periods/"+label, ""), "period")
			require.Contains(t, p.Errors["period"], "want a label such as 2026-12", "an example, not the Go layout 2006-01")
		}
	})

	t.Run("UnknownCustomer", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireProblem(t, b.do(http.MethodGet, "/v1/customers/ghost/periods/2026-11", ""), http.StatusNotFound, "not_found")
	})

	t.Run("UnknownPeriod", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("e1", 100)).Code)
		p := requireProblem(t, b.do(http.MethodGet, "/v1/customers/acme/periods/2026-10", ""), http.StatusNotFound, "not_found")
		require.Equal(t, `period 2026-10 of customer "acme" not found`, p.Detail)
		// What is missing, not the chain of what the ledger was doing.
		p = requireProblem(t, b.do(http.MethodPost, "/v1/customers/acme/periods/2026-10/close", ""), http.StatusNotFound, "not_found")
		require.Equal(t, `period 2026-10 of customer "acme" not found`, p.Detail)
	})
}

func TestPeriodList(t *testing.T) {
	t.Parallel()

	type listBody struct {
		Data       []periodBody `json:"data"`
		HasMore    bool         `json:"has_more"`
		NextCursor *string      `json:"next_cursor"`
	}

	t.Run("BadParameters", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for query, field := range map[string]string{
			"limit=0":                   "limit",
			"limit=501":                 "limit",
			"limit=ten":                 "limit",
			"limit=%00":                 "limit",
			"starting_after=2026-13":    "starting_after",
			"starting_after=%00":        "starting_after",
			"starting_after=%ff":        "starting_after",
			"starting_after=2026-11%0A": "starting_after",
		} {
			p := requireInvalid(t, b.do(http.MethodGet, "/v1/customers/acme/periods?"+query, ""), field)
			require.Len(t, p.Errors, 1, "%s: %v", query, p.Errors)
		}
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.do(http.MethodGet, "/v1/customers/acme/periods", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.JSONEq(t, `{"data":[],"has_more":false,"next_cursor":null}`, rec.Body.String())
	})

	t.Run("NewestFirst", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		b.Clock.Set(time.Date(2026, 10, 20, 0, 0, 0, 0, time.UTC))
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("oct", 40)).Code)
		b.Clock.Set(time.Date(2026, 11, 14, 0, 0, 0, 0, time.UTC))
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("nov1", 10)).Code)
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("nov2", 15)).Code)
		_, err := b.Pool.Exec(ctx, `UPDATE billing.periods SET status = 'closed', closed_at = now() WHERE period = '2026-10'`)
		require.NoError(t, err)

		rec := b.do(http.MethodGet, "/v1/customers/acme/periods", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		list := decodeJSON[listBody](t, rec)
		require.Len(t, list.Data, 2)
		nov, oct := list.Data[0], list.Data[1]
		require.Equal(t, "2026-11", nov.Period)
		require.Equal(t, "open", nov.Status)
		require.Equal(t, int64(2), nov.EventCount)
		require.Equal(t, int64(25), nov.TotalCents)
		require.Equal(t, "2026-10", oct.Period)
		require.Equal(t, "closed", oct.Status)
		require.Equal(t, int64(1), oct.EventCount)
		require.Equal(t, int64(40), oct.TotalCents)
	})

	t.Run("Pages", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for m := time.June; m <= time.November; m++ {
			b.Clock.Set(time.Date(2026, m, 10, 0, 0, 0, 0, time.UTC))
			require.Equal(t, http.StatusCreated, b.postEvent(eventJSON(m.String(), 1)).Code)
		}
		var walked []string
		path := "/v1/customers/acme/periods?limit=4"
		for range 3 {
			rec := b.do(http.MethodGet, path, "")
			require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
			page := decodeJSON[listBody](t, rec)
			for _, p := range page.Data {
				walked = append(walked, p.Period)
			}
			if !page.HasMore {
				require.Nil(t, page.NextCursor)
				break
			}
			require.NotNil(t, page.NextCursor)
			require.Equal(t, page.Data[len(page.Data)-1].Period, *page.NextCursor)
			path = "/v1/customers/acme/periods?limit=4&starting_after=" + *page.NextCursor
		}
		require.Equal(t, []string{"2026-11", "2026-10", "2026-09", "2026-08", "2026-07", "2026-06"}, walked)

		// The default page holds all six.
		list := decodeJSON[listBody](t, b.do(http.MethodGet, "/v1/customers/acme/periods", ""))
		require.Len(t, list.Data, 6)
		require.False(t, list.HasMore)
	})

	t.Run("UnknownCustomer", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireProblem(t, b.do(http.MethodGet, "/v1/customers/ghost/periods", ""), http.StatusNotFound, "not_found")
		for _, id := range []string{"%00", "%ff", "a%0Ab", strings.Repeat("x", 256)} {
			requireProblem(t, b.do(http.MethodGet, "/v1/customers/"+id+"/periods", ""), http.StatusNotFound, "not_found")
		}
	})
}
