package stripesim

import (
	"cmp"
	"net/http"
	"slices"
)

// paymentIntentCompareNewestFirst orders PaymentIntents newest first; PaymentIntents created
// in the same second are ordered by creation sequence, newest first, so paging is stable.
func paymentIntentCompareNewestFirst(a, b *paymentIntent) int {
	if c := cmp.Compare(b.Created, a.Created); c != 0 {
		return c
	}
	return cmp.Compare(b.seq, a.seq)
}

func (s *Server) handlePaymentIntentList(w http.ResponseWriter, r *http.Request, rs *requestState) {
	s.latencyApply(r.Context(), "")
	form, apiErr := formParse(w, r)
	if apiErr != nil {
		s.writeError(w, rs, apiErr)
		return
	}
	params, apiErr := listParamsParse(form)
	if apiErr != nil {
		s.writeError(w, rs, apiErr)
		return
	}
	customerID := form.Get("customer")

	s.mu.Lock()
	defer s.mu.Unlock()
	if _, faulted := s.faultTakeLocked(customerID, faultKindIs(FaultKindListError500)); faulted {
		s.writeError(w, rs, errInternal())
		return
	}

	var cursor *paymentIntent
	if param, id := params.cursor(); id != "" {
		pi, ok := s.paymentIntentsByID[id]
		if !ok {
			s.writeError(w, rs, errReferenceMissing(param, "payment_intent", id))
			return
		}
		cursor = pi
	}

	matching := make([]*paymentIntent, 0, len(s.paymentIntents))
	for _, pi := range s.paymentIntents {
		if customerID != "" && derefString(pi.Customer) != customerID {
			continue
		}
		if !params.created.match(pi.Created) {
			continue
		}
		matching = append(matching, pi)
	}
	writeListPage(s, w, matching, cursor, params, paymentIntentCompareNewestFirst, "/v1/payment_intents")
}

// writeListPage sorts the matching objects newest first and writes the page
// that params and cursor select, as Stripe's list object for url.
func writeListPage[T comparable](s *Server, w http.ResponseWriter, matching []T, cursor T, params listParams, compare func(a, b T) int, url string) {
	slices.SortFunc(matching, compare)
	page, hasMore := listPage(matching, cursor, params, compare)
	s.writeJSONBytes(w, http.StatusOK, mustJSON(listWireStripe[T]{Object: "list", Data: page, HasMore: hasMore, URL: url}))
}
