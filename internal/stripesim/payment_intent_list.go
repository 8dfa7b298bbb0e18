package stripesim

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"
)

// paymentIntentListLimitDefault and paymentIntentListLimitMax are Stripe's list limits.
const (
	paymentIntentListLimitDefault = 10
	paymentIntentListLimitMax     = 100
)

type paymentIntentListWire struct {
	Object  string           `json:"object"`
	Data    []*paymentIntent `json:"data"`
	HasMore bool             `json:"has_more"`
	URL     string           `json:"url"`
}

// paymentIntentCompareNewestFirst orders PaymentIntents newest first; PaymentIntents created
// in the same second are ordered by creation sequence, newest first, so paging is stable.
func paymentIntentCompareNewestFirst(a, b *paymentIntent) int {
	if c := cmp.Compare(b.Created, a.Created); c != 0 {
		return c
	}
	return cmp.Compare(b.seq, a.seq)
}

// createdFilter is the created[gt|gte|lt|lte] (or created=N) filter of a list request.
type createdFilter struct {
	gt, gte, lt, lte *int64
}

func (f createdFilter) match(created int64) bool {
	return (f.gt == nil || created > *f.gt) &&
		(f.gte == nil || created >= *f.gte) &&
		(f.lt == nil || created < *f.lt) &&
		(f.lte == nil || created <= *f.lte)
}

func (s *Server) handlePaymentIntentList(w http.ResponseWriter, r *http.Request, rs *requestState) {
	s.latencyApply(r.Context(), "")
	form, apiErr := formParse(w, r)
	if apiErr != nil {
		s.writeError(w, rs, apiErr)
		return
	}

	limit := paymentIntentListLimitDefault
	if raw := form.Get("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil {
			s.writeError(w, rs, errParameterInvalid("parameter_invalid_integer", "limit", fmt.Sprintf("Invalid integer: %s", raw)))
			return
		}
		if n < 1 || n > paymentIntentListLimitMax {
			s.writeError(w, rs, errParameterInvalid("", "limit",
				fmt.Sprintf("This value must be between 1 and %d (it currently is %d).", paymentIntentListLimitMax, n)))
			return
		}
		limit = n
	}

	var filter createdFilter
	for param, dst := range map[string]**int64{
		"created":      &filter.gte, // created=N is an exact match: gte and lte N
		"created[gt]":  &filter.gt,
		"created[gte]": &filter.gte,
		"created[lt]":  &filter.lt,
		"created[lte]": &filter.lte,
	} {
		raw := form.Get(param)
		if raw == "" {
			continue
		}
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			s.writeError(w, rs, errParameterInvalid("parameter_invalid_integer", param, fmt.Sprintf("Invalid integer: %s", raw)))
			return
		}
		*dst = &n
		if param == "created" {
			exact := n
			filter.lte = &exact
		}
	}

	startingAfter, endingBefore := form.Get("starting_after"), form.Get("ending_before")
	if startingAfter != "" && endingBefore != "" {
		s.writeError(w, rs, errParameterInvalid("parameters_exclusive", "ending_before",
			"You may only specify one of these parameters: ending_before, starting_after."))
		return
	}
	customerID := form.Get("customer")

	s.mu.Lock()
	defer s.mu.Unlock()

	var cursor *paymentIntent
	for param, id := range map[string]string{"starting_after": startingAfter, "ending_before": endingBefore} {
		if id == "" {
			continue
		}
		pi, ok := s.paymentIntentsByID[id]
		if !ok {
			e := errResourceMissing(param, "payment_intent", id)
			e.status = http.StatusBadRequest
			s.writeError(w, rs, e)
			return
		}
		cursor = pi
	}

	matching := make([]*paymentIntent, 0, len(s.paymentIntents))
	for _, pi := range s.paymentIntents {
		if customerID != "" && derefString(pi.Customer) != customerID {
			continue
		}
		if !filter.match(pi.Created) {
			continue
		}
		matching = append(matching, pi)
	}
	slices.SortFunc(matching, paymentIntentCompareNewestFirst)

	var page []*paymentIntent
	hasMore := false
	switch {
	case startingAfter != "":
		// Everything older than the cursor, newest first.
		i, _ := slices.BinarySearchFunc(matching, cursor, paymentIntentCompareNewestFirst)
		rest := matching[i:]
		if len(rest) > 0 && rest[0] == cursor {
			rest = rest[1:]
		}
		page, hasMore = rest[:min(limit, len(rest))], len(rest) > limit
	case endingBefore != "":
		// The limit PaymentIntents just newer than the cursor, still newest first.
		i, _ := slices.BinarySearchFunc(matching, cursor, paymentIntentCompareNewestFirst)
		newer := matching[:i]
		page, hasMore = newer[max(0, len(newer)-limit):], len(newer) > limit
	default:
		page, hasMore = matching[:min(limit, len(matching))], len(matching) > limit
	}

	s.writeJSONBytes(w, http.StatusOK, mustJSON(paymentIntentListWire{
		Object:  "list",
		Data:    page,
		HasMore: hasMore,
		URL:     "/v1/payment_intents",
	}))
}
