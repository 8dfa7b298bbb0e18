package stripesim

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
)

// listLimitDefault and listLimitMax are Stripe's page sizes of list endpoints.
const (
	listLimitDefault = 10
	listLimitMax     = 100
)

// listWireStripe is a page of a Stripe list endpoint: {"object":"list","data",…}.
type listWireStripe[T any] struct {
	Object  string `json:"object"`
	Data    []T    `json:"data"`
	HasMore bool   `json:"has_more"`
	URL     string `json:"url"`
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

// listParams are the paging and created parameters every simulated list endpoint takes.
type listParams struct {
	limit         int
	created       createdFilter
	startingAfter string
	endingBefore  string
}

// cursor returns the name and value of the paging cursor (starting_after or ending_before),
// or two empty strings when the request has none.
func (p listParams) cursor() (param, id string) {
	switch {
	case p.startingAfter != "":
		return "starting_after", p.startingAfter
	case p.endingBefore != "":
		return "ending_before", p.endingBefore
	}
	return "", ""
}

// listParamsParse parses limit (default listLimitDefault, 1 to listLimitMax), created /
// created[gt|gte|lt|lte] and starting_after / ending_before (mutually exclusive), answering
// Stripe's 400 for invalid values.
func listParamsParse(form url.Values) (listParams, *apiError) {
	p := listParams{limit: listLimitDefault}
	if raw := form.Get("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil {
			return p, errParameterInvalid("parameter_invalid_integer", "limit", fmt.Sprintf("Invalid integer: %s", raw))
		}
		if n < 1 || n > listLimitMax {
			return p, errParameterInvalid("", "limit",
				fmt.Sprintf("This value must be between 1 and %d (it currently is %d).", listLimitMax, n))
		}
		p.limit = n
	}

	for _, param := range []string{"created", "created[gt]", "created[gte]", "created[lt]", "created[lte]"} {
		raw := form.Get(param)
		if raw == "" {
			continue
		}
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return p, errParameterInvalid("parameter_invalid_integer", param, fmt.Sprintf("Invalid integer: %s", raw))
		}
		switch param {
		case "created": // an exact match: gte and lte N
			exact := n
			p.created.gte, p.created.lte = &n, &exact
		case "created[gt]":
			p.created.gt = &n
		case "created[gte]":
			p.created.gte = &n
		case "created[lt]":
			p.created.lt = &n
		case "created[lte]":
			p.created.lte = &n
		}
	}

	p.startingAfter, p.endingBefore = form.Get("starting_after"), form.Get("ending_before")
	if p.startingAfter != "" && p.endingBefore != "" {
		return p, errParameterInvalid("parameters_exclusive", "ending_before",
			"You may only specify one of these parameters: ending_before, starting_after.")
	}
	return p, nil
}

// listPage returns the page p asks for out of matching, which is sorted newest first by
// compare, and whether more follow in the paging direction. cursor is the object named by
// starting_after or ending_before (unused when p has no cursor); it need not be in matching.
// starting_after pages towards older objects, ending_before towards newer ones; both pages
// are newest first.
func listPage[T comparable](matching []T, cursor T, p listParams, compare func(a, b T) int) ([]T, bool) {
	switch {
	case p.startingAfter != "":
		i, _ := slices.BinarySearchFunc(matching, cursor, compare)
		rest := matching[i:]
		if len(rest) > 0 && rest[0] == cursor {
			rest = rest[1:]
		}
		return rest[:min(p.limit, len(rest))], len(rest) > p.limit
	case p.endingBefore != "":
		i, _ := slices.BinarySearchFunc(matching, cursor, compare)
		newer := matching[:i]
		return newer[max(0, len(newer)-p.limit):], len(newer) > p.limit
	default:
		return matching[:min(p.limit, len(matching))], len(matching) > p.limit
	}
}
