package api

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
)

// writeError answers err: ledger and decoding errors map to their status in
// this one place; anything else is internal.
func writeError(logger *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	if p, ok := problemFor(err); ok {
		writeProblem(w, r, p)
		return
	}
	writeInternal(logger, w, r, err)
}

// problemFor maps a known error to its problem, or reports false.
func problemFor(err error) (problem, bool) {
	var (
		de *decodeError
		ve *ledger.ValidationError
		pe *pricing.ValidationError
		ce *ledger.ConflictError
		ue *ledger.UnpricedMetricError
	)
	switch {
	case errors.As(err, &de):
		return problem{Status: de.status, Code: de.code, Detail: de.detail, Errors: de.fields, Omitted: de.omitted}, true
	case errors.As(err, &ve):
		return problem{Status: http.StatusUnprocessableEntity, Code: "validation_error",
			Detail: "the request has invalid fields; see errors", Errors: ve.Fields}, true
	case errors.As(err, &pe):
		// A plan's fields, by their path (prices.api_calls.tiers[1].up_to).
		return problem{Status: http.StatusUnprocessableEntity, Code: "validation_error",
			Detail: "the plan has invalid fields; see errors", Errors: pe.Fields}, true
	case errors.Is(err, pricing.ErrMalformedPlan):
		return problem{Status: http.StatusBadRequest, Code: "malformed_json", Detail: err.Error()}, true
	case errors.As(err, &ce):
		return problem{Status: http.StatusConflict, Code: ce.Code, Detail: ce.Detail}, true
	case errors.As(err, &ue):
		return problem{Status: http.StatusUnprocessableEntity, Code: "unpriced_metric", Detail: ue.Detail}, true
	case errors.Is(err, ledger.ErrNotFound):
		// What is missing, not the chain of what was being done.
		detail := "not found"
		if nf := (*ledger.NotFoundError)(nil); errors.As(err, &nf) {
			detail = nf.Error()
		}
		return problem{Status: http.StatusNotFound, Code: "not_found", Detail: detail}, true
	}
	return problem{}, false
}

func handleNotFound(logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, problem{Status: http.StatusNotFound, Code: "not_found",
			Detail: "no route for " + r.Method + " " + r.URL.Path})
	})
}
