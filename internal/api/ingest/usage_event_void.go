package ingest

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
)

// UsageEventVoid voids an event with void (the ledger's UsageEventVoid),
// attributed to actor(r), the calling key: 201 with the void, 200 with the
// first void when the event was voided already (Idempotent-Replayed), 404
// for an event never recorded, 409 period_closed, 422 invalid.
func UsageEventVoid(logger *slog.Logger, actor func(*http.Request) string,
	void func(context.Context, ledger.UsageEventVoidParams) (*ledger.UsageEventVoidResult, error),
) http.Handler {
	type request struct {
		CustomerID string `json:"customer_id"`
		EventID    string `json:"event_id"`
		Reason     string `json:"reason"`
	}
	type response struct {
		CustomerID string             `json:"customer_id"`
		EventID    string             `json:"event_id"`
		Period     string             `json:"period"`
		Reason     string             `json:"reason"`
		VoidedBy   string             `json:"voided_by"`
		VoidedAt   time.Time          `json:"voided_at"`
		Event      usageEventResponse `json:"event"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		res, err := void(r.Context(), ledger.UsageEventVoidParams{CustomerID: req.CustomerID, EventID: req.EventID,
			Reason: req.Reason, Actor: actor(r)})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		status := http.StatusCreated
		if res.Replay {
			status = http.StatusOK
			w.Header().Set(replayHeader, "true")
		}
		v := res.Void
		httpjson.Encode(w, status, response{CustomerID: v.CustomerID, EventID: v.EventID, Period: v.Period,
			Reason: v.Reason, VoidedBy: v.VoidedBy, VoidedAt: v.VoidedAt, Event: newUsageEventResponse(v.Event)})
	})
}
