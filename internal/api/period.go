package api

import (
	"log/slog"
	"net/http"
	"strconv"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
)

// periodResponse is a billing period as the API shows it.
type periodResponse = ledger.PublicPeriod

func newPeriodResponse(p *ledger.Period) periodResponse { return p.Public() }

// handlePeriodList lists a customer's periods newest first, a page at a time
// like handleChargeList: ?limit= (default 50, at most 500) and
// ?starting_after=<next_cursor> (the label of the last period of the
// previous page); has_more says whether another page follows.
func handlePeriodList(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type response struct {
		Data       []periodResponse `json:"data"`
		HasMore    bool             `json:"has_more"`
		NextCursor *string          `json:"next_cursor"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := newQueryParams(r.URL)
		p := ledger.PeriodListParams{
			CustomerID:    r.PathValue("customer_id"),
			StartingAfter: q.str("starting_after"),
			Limit: int(q.integer("limit", 0, 1, ledger.PeriodListLimitMax,
				"must be a whole number between 1 and "+strconv.Itoa(ledger.PeriodListLimitMax))),
		}
		if err := q.err(); err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		periods, more, err := l.PeriodListPage(r.Context(), p)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := response{Data: make([]periodResponse, 0, len(periods)), HasMore: more}
		for _, p := range periods {
			resp.Data = append(resp.Data, newPeriodResponse(p))
		}
		if more {
			cursor := periods[len(periods)-1].Period
			resp.NextCursor = &cursor
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}

// periodLabel returns the request's {period}, or a *ledger.ValidationError
// showing the expected form.
func periodLabel(r *http.Request, l *ledger.Ledger) (string, error) {
	label := r.PathValue("period")
	if _, err := l.Cadence().ParseLabel(label); err != nil {
		return "", &ledger.ValidationError{Fields: map[string]string{"period": err.Error()}}
	}
	return label, nil
}

// handlePeriodGet returns one period, 422 for a malformed label, 404 for an
// unknown one.
func handlePeriodGet(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		label, err := periodLabel(r, l)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		p, err := l.PeriodGet(r.Context(), r.PathValue("customer_id"), label)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusOK, newPeriodResponse(p))
	})
}

// handlePeriodClose closes a period now (admin): it stops taking events at
// once, its charge is computed, and its charge job runs now. Closing again
// is harmless and returns the same charge.
func handlePeriodClose(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type response struct {
		Period periodResponse `json:"period"`
		Charge chargeResponse `json:"charge"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		label, err := periodLabel(r, l)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		customerID := r.PathValue("customer_id")
		c, err := l.PeriodClose(r.Context(), ledger.PeriodCloseParams{
			CustomerID: customerID, Period: label, Actor: actorFrom(r), RunChargeJobNow: true,
		})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		p, err := l.PeriodGet(r.Context(), customerID, label)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusOK, response{Period: newPeriodResponse(p), Charge: newChargeResponse(c)})
	})
}
