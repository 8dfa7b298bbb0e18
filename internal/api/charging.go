package api

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
)

// The kill switch (admin): pause charging on every replica at once, resume
// it, and read its state. A pause stops every charge and resolve job before
// it calls Stripe; webhooks and the reconciler's reads go on.

// chargingResponse is the kill switch's state as the API shows it: Paused
// is River's charge queue's. Since is when charging was paused or last
// resumed; By and Reason say who did it and why, null when no operator
// did. Discrepancy, null when none, says how the operator log disagrees
// with the queue (paused or resumed outside Tally) and what to run.
type chargingResponse struct {
	Paused      bool       `json:"paused"`
	Since       *time.Time `json:"since"`
	By          *string    `json:"by"`
	Reason      *string    `json:"reason"`
	Discrepancy *string    `json:"discrepancy"`
}

func newChargingResponse(st *ledger.ChargingStatus) chargingResponse {
	resp := chargingResponse{Paused: st.Paused, Since: st.Since}
	if st.By != "" {
		resp.By = &st.By
	}
	if st.Reason != "" {
		resp.Reason = &st.Reason
	}
	if st.Discrepancy != "" {
		resp.Discrepancy = &st.Discrepancy
	}
	return resp
}

// handleChargingGet returns the kill switch's state.
func handleChargingGet(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, err := l.ChargingGet(r.Context())
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusOK, newChargingResponse(st))
	})
}

// handleChargingPause pauses charging (ledger.ChargingPause) with the
// required {"reason"}; pausing again is recorded and changes nothing. 200
// with the new state.
func handleChargingPause(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return handleChargingSet(logger, l.ChargingPause)
}

// handleChargingResume resumes charging (ledger.ChargingResume) with the
// required {"reason"}. 200 with the new state.
func handleChargingResume(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return handleChargingSet(logger, l.ChargingResume)
}

// handleChargingSet decodes {"reason"} and sets the kill switch with set as
// the calling key.
func handleChargingSet(logger *slog.Logger, set func(ctx context.Context, actor, reason string) (*ledger.ChargingStatus, error)) http.Handler {
	type request struct {
		Reason string `json:"reason"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		st, err := set(r.Context(), actorFrom(r), req.Reason)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusOK, newChargingResponse(st))
	})
}
