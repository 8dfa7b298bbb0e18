package httpjson

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
)

// WriteError answers err: ledger, pricing and decoding errors map to their
// status in this one place (ProblemFor); anything else is internal
// (WriteInternal).
func WriteError(logger *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	if p, ok := ProblemFor(err); ok {
		WriteProblem(w, r, p)
		return
	}
	WriteInternal(logger, w, r, err)
}

// ProblemFor maps a known error (a *DecodeError, the ledger's and the
// pricing's validation errors, a conflict, an unpriced metric, not found)
// to its problem, or reports false.
func ProblemFor(err error) (Problem, bool) {
	var (
		de *DecodeError
		ve *ledger.ValidationError
		pe *pricing.ValidationError
		ce *ledger.ConflictError
		ue *ledger.UnpricedMetricError
	)
	switch {
	case errors.As(err, &de):
		return Problem{Status: de.Status, Code: de.Code, Detail: de.Detail, Errors: de.Fields, Omitted: de.Omitted}, true
	case errors.As(err, &ve):
		return Problem{Status: http.StatusUnprocessableEntity, Code: "validation_error",
			Detail: "the request has invalid fields; see errors", Errors: ve.Fields}, true
	case errors.As(err, &pe):
		// A plan's fields, by their path (prices.api_calls.tiers[1].up_to).
		return Problem{Status: http.StatusUnprocessableEntity, Code: "validation_error",
			Detail: "the plan has invalid fields; see errors", Errors: pe.Fields}, true
	case errors.Is(err, pricing.ErrMalformedPlan):
		return Problem{Status: http.StatusBadRequest, Code: "malformed_json", Detail: err.Error()}, true
	case errors.As(err, &ce):
		return Problem{Status: http.StatusConflict, Code: ce.Code, Detail: ce.Detail}, true
	case errors.As(err, &ue):
		return Problem{Status: http.StatusUnprocessableEntity, Code: "unpriced_metric", Detail: ue.Detail}, true
	case errors.Is(err, ledger.ErrNotFound):
		// What is missing, not the chain of what was being done.
		detail := "not found"
		if nf := (*ledger.NotFoundError)(nil); errors.As(err, &nf) {
			detail = nf.Error()
		}
		return Problem{Status: http.StatusNotFound, Code: "not_found", Detail: detail}, true
	}
	return Problem{}, false
}
