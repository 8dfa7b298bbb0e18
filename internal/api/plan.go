package api

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
)

// planVersionResponse is one version of a plan as the API shows it: its
// prices as the canonical JSON stores them (decimals as strings without
// trailing zeros, fields in a fixed order).
type planVersionResponse struct {
	PlanID    string          `json:"plan_id"`
	Version   int32           `json:"version"`
	Currency  string          `json:"currency"`
	Prices    json.RawMessage `json:"prices"`
	CreatedAt time.Time       `json:"created_at"`
	CreatedBy string          `json:"created_by"`
}

func newPlanVersionResponse(v *ledger.PlanVersion) (planVersionResponse, error) {
	var book struct {
		Prices json.RawMessage `json:"prices"`
	}
	if err := json.Unmarshal(v.PriceBook, &book); err != nil {
		return planVersionResponse{}, fmt.Errorf("error reading version %d of plan %s: %w", v.Version, v.PlanID, err)
	}
	return planVersionResponse{PlanID: v.PlanID, Version: v.Version, Currency: v.Plan.Currency, Prices: book.Prices,
		CreatedAt: v.CreatedAt, CreatedBy: v.CreatedBy}, nil
}

// handlePlanPut puts a plan's price book (admin): 201 with the new version
// (version 1 for a new plan), 200 with the latest version when the body's
// content equals it (a replay: nothing is written). The body is decoded by
// pricing.ParsePlan, as strictly as any other; its invalid fields are 422 by
// their path.
func handlePlanPut(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := httpjson.ReadBody(w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		plan, err := pricing.ParsePlan(body)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		v, created, err := l.PlanPut(r.Context(), ledger.PlanPutParams{PlanID: r.PathValue("plan_id"), Plan: plan, Actor: actorFrom(r)})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp, err := newPlanVersionResponse(v)
		if err != nil {
			httpjson.WriteInternal(logger, w, r, err)
			return
		}
		httpjson.Encode(w, createdOrOK(created), resp)
	})
}

// handlePlanGet returns a plan with every version, oldest first, or 404.
func handlePlanGet(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type response struct {
		PlanID   string                `json:"plan_id"`
		Currency string                `json:"currency"`
		Versions []planVersionResponse `json:"versions"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		versions, err := l.PlanGet(r.Context(), r.PathValue("plan_id"))
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := response{PlanID: versions[0].PlanID, Currency: versions[0].Plan.Currency,
			Versions: make([]planVersionResponse, len(versions))}
		for i, v := range versions {
			if resp.Versions[i], err = newPlanVersionResponse(v); err != nil {
				httpjson.WriteInternal(logger, w, r, err)
				return
			}
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}

// handlePlanList lists plans by plan_id (byte order), each as its latest
// version, a page at a time like handleChargeList: ?limit= (default 50, at
// most 500) and ?starting_after=<next_cursor> (the plan_id of the last plan
// of the previous page).
func handlePlanList(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type response struct {
		Data       []planVersionResponse `json:"data"`
		HasMore    bool                  `json:"has_more"`
		NextCursor *string               `json:"next_cursor"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := newQueryParams(r.URL)
		p := ledger.PlanListParams{
			StartingAfter: q.str("starting_after"),
			Limit: int(q.integer("limit", 0, 1, ledger.PlanListLimitMax,
				"must be a whole number between 1 and "+strconv.Itoa(ledger.PlanListLimitMax))),
		}
		if err := q.err(); err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		plans, more, err := l.PlanList(r.Context(), p)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := response{Data: make([]planVersionResponse, len(plans)), HasMore: more}
		for i, v := range plans {
			if resp.Data[i], err = newPlanVersionResponse(v); err != nil {
				httpjson.WriteInternal(logger, w, r, err)
				return
			}
		}
		if more {
			cursor := plans[len(plans)-1].PlanID
			resp.NextCursor = &cursor
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}
