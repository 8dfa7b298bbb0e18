package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/metrics"
)

// usageEventRequest is one usage event as a producer posts it.
type usageEventRequest struct {
	CustomerID  string          `json:"customer_id"`
	EventID     string          `json:"event_id"`
	AmountCents *int64          `json:"amount_cents"`
	Currency    string          `json:"currency"`
	Quantity    json.RawMessage `json:"quantity"`
	Metric      string          `json:"metric"`
	Properties  json.RawMessage `json:"properties"`
	OccurredAt  *string         `json:"occurred_at"`
}

// params converts the request, or returns a *ledger.ValidationError for the
// fields only the API can judge (an amount of 0 sent, the JSON type of
// quantity, timestamp syntax). The ledger judges the rest, presence
// included: amount_cents, or metric and quantity.
func (req usageEventRequest) params() (ledger.UsageEventParams, error) {
	p := ledger.UsageEventParams{
		CustomerID: req.CustomerID, EventID: req.EventID, Currency: req.Currency,
		Metric: req.Metric, Properties: req.Properties,
	}
	fields := map[string]string{}
	if req.AmountCents != nil {
		if *req.AmountCents == 0 { // the ledger's 0 is none
			fields["amount_cents"] = fmt.Sprintf("must be a whole number of minor units between 1 and %d; got 0", ledger.AmountCentsMax)
		}
		p.AmountCents = *req.AmountCents
	}
	// A quantity is a JSON number or the same digits in a string, read
	// exactly (never as a float64); null or "" is none, as for metric.
	switch q := bytes.TrimSpace(req.Quantity); {
	case len(q) == 0 || string(q) == "null":
	case q[0] == '"':
		if err := json.Unmarshal(q, &p.Quantity); err != nil {
			fields["quantity"] = quantityWant
		}
	case q[0] == '-' || (q[0] >= '0' && q[0] <= '9'):
		p.Quantity = string(q)
	default:
		fields["quantity"] = quantityWant
	}
	if req.OccurredAt != nil {
		t, err := time.Parse(time.RFC3339Nano, *req.OccurredAt)
		if err != nil {
			fields["occurred_at"] = "must be an RFC 3339 timestamp such as 2026-11-30T13:05:00Z, or omitted for now"
		} else {
			p.OccurredAt = &t
		}
	}
	if len(fields) > 0 {
		return p, &ledger.ValidationError{Fields: fields}
	}
	return p, nil
}

// quantityWant says what a quantity of the wrong JSON type should be.
const quantityWant = `must be a number or a decimal in a string, such as 12.5 or "12.5"`

// usageEventResponse is a stored usage event as the API shows it: a
// quantity event's amount_cents is null (its period's plan prices it), and
// a quantity is an exact JSON number, such as 12.5.
type usageEventResponse struct {
	CustomerID  string          `json:"customer_id"`
	EventID     string          `json:"event_id"`
	Period      string          `json:"period"`
	AmountCents *int64          `json:"amount_cents"`
	Currency    string          `json:"currency"`
	Quantity    json.RawMessage `json:"quantity"`
	Metric      *string         `json:"metric"`
	Properties  json.RawMessage `json:"properties"`
	OccurredAt  time.Time       `json:"occurred_at"`
	ReceivedAt  time.Time       `json:"received_at"`
}

func newUsageEventResponse(e *ledger.UsageEvent) usageEventResponse {
	resp := usageEventResponse{
		CustomerID: e.CustomerID, EventID: e.EventID, Period: e.Period,
		Currency: e.Currency, Metric: e.Metric, Properties: e.Properties,
		OccurredAt: e.OccurredAt, ReceivedAt: e.ReceivedAt,
	}
	if e.AmountCents != 0 {
		amount := e.AmountCents
		resp.AmountCents = &amount
	}
	if e.Quantity != nil {
		resp.Quantity = json.RawMessage(e.Quantity.Text('f'))
	}
	return resp
}

// replayHeader marks a response that replays an already recorded event.
const replayHeader = "Idempotent-Replayed"

// UsageEventCreate records one event with record (the ledger's
// UsageEventRecord): 201 created, 200 exact replay (same body as the first
// answer), 409 idempotency_conflict or period_closed, 422 invalid. It counts
// each event's result in m (nil: not counted).
func UsageEventCreate(logger *slog.Logger, m *metrics.Metrics, record func(context.Context, ledger.UsageEventParams) (*ledger.UsageEventResult, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[usageEventRequest](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		p, err := req.params()
		if err != nil {
			m.CountUsageEvents(metrics.UsageRejected, 1)
			httpjson.WriteError(logger, w, r, err)
			return
		}
		res, err := record(r.Context(), p)
		if err != nil {
			if result := usageResult(err); result != "" {
				m.CountUsageEvents(result, 1)
			}
			httpjson.WriteError(logger, w, r, err)
			return
		}
		status := http.StatusCreated
		if res.Replay {
			status = http.StatusOK
			w.Header().Set(replayHeader, "true")
		}
		m.CountUsageEvents(usageResultOf(res), 1)
		httpjson.Encode(w, status, newUsageEventResponse(res.Event))
	})
}

// UsageEventBatch records up to 1000 events all-or-nothing with record
// (the ledger's UsageEventRecordBatch), or only checks them with check
// (UsageEventCheckBatch) when some items could not even be decoded. On
// success it answers 201 (200 when every event was a replay) with one result
// per event; otherwise nothing is written and the problem lists each failing
// index: 422 when any item is invalid, else 409. It counts the batch's size
// and each event's result in m (nil: not counted).
func UsageEventBatch(logger *slog.Logger, m *metrics.Metrics,
	record func(context.Context, []ledger.UsageEventParams) ([]*ledger.UsageEventResult, error),
	check func(context.Context, []ledger.UsageEventParams) error,
) http.Handler {
	type request struct {
		Events []json.RawMessage `json:"events"`
	}
	type result struct {
		Status string             `json:"status"` // created or replayed
		Event  usageEventResponse `json:"event"`
	}
	type response struct {
		Created  int      `json:"created"`
		Replayed int      `json:"replayed"`
		Data     []result `json:"data"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitBatch)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		m.ObserveBatch(len(req.Events))
		if len(req.Events) == 0 || len(req.Events) > ledger.UsageEventBatchMax {
			httpjson.WriteError(logger, w, r, &ledger.ValidationError{Fields: map[string]string{
				"events": fmt.Sprintf("must hold between 1 and %d events; got %d", ledger.UsageEventBatchMax, len(req.Events))}})
			return
		}

		// Items that fail to decode are reported with the ledger's verdict on
		// the others; index maps the ledger's positions back to the request's.
		itemErrs := map[int]error{}
		var params []ledger.UsageEventParams
		var index []int
		for i, raw := range req.Events {
			item, err := httpjson.DecodeStrict[usageEventRequest](raw, "")
			var de *httpjson.DecodeError
			if errors.As(err, &de) && de.Status != http.StatusUnprocessableEntity {
				// Unreachable for a well-formed outer body; keep item errors 422.
				de.Status, de.Code = http.StatusUnprocessableEntity, "validation_error"
			}
			if err == nil {
				var p ledger.UsageEventParams
				if p, err = item.params(); err == nil {
					params = append(params, p)
					index = append(index, i)
					continue
				}
			}
			itemErrs[i] = err
		}
		var results []*ledger.UsageEventResult
		if len(params) > 0 {
			if len(itemErrs) > 0 {
				// Some items are already rejected: only check the others,
				// so the answer lists every problem and nothing is written.
				err = check(r.Context(), params)
			} else {
				results, err = record(r.Context(), params)
			}
			var batchErr *ledger.BatchError
			switch {
			case errors.As(err, &batchErr):
				for i, e := range batchErr.Items {
					itemErrs[index[i]] = e
				}
			case err != nil:
				httpjson.WriteInternal(logger, w, r, err)
				return
			}
		}
		if len(itemErrs) > 0 {
			// Nothing was written: each failing item counts as what failed
			// it, the others as rejected with their batch.
			counted := 0
			for _, e := range itemErrs {
				if result := usageResult(e); result != "" {
					m.CountUsageEvents(result, 1)
					counted++
				}
			}
			m.CountUsageEvents(metrics.UsageRejected, len(req.Events)-counted)
			writeBatchProblem(logger, w, r, itemErrs)
			return
		}
		for _, res := range results {
			m.CountUsageEvents(usageResultOf(res), 1)
		}

		resp := response{Data: make([]result, len(results))}
		for i, res := range results {
			resp.Data[i] = result{Status: "created", Event: newUsageEventResponse(res.Event)}
			if res.Replay {
				resp.Data[i].Status = "replayed"
				resp.Replayed++
			} else {
				resp.Created++
			}
		}
		status := http.StatusCreated
		if resp.Created == 0 {
			status = http.StatusOK
		}
		httpjson.Encode(w, status, resp)
	})
}

// writeBatchProblem answers a rejected batch with the errors of its first
// httpjson.ProblemItemsMax failing items, each listing at most itemErrorsMax field
// problems, and counts the others.
func writeBatchProblem(logger *slog.Logger, w http.ResponseWriter, r *http.Request, itemErrs map[int]error) {
	p := httpjson.Problem{Status: http.StatusConflict, Code: "batch_rejected",
		Detail: fmt.Sprintf("%d events were rejected, so none of the batch was recorded; fix them and send the whole batch again", len(itemErrs))}
	for _, i := range slices.Sorted(maps.Keys(itemErrs)) {
		ip, ok := httpjson.ProblemFor(itemErrs[i])
		if !ok {
			httpjson.WriteInternal(logger, w, r, itemErrs[i])
			return
		}
		if ip.Status == http.StatusUnprocessableEntity {
			p.Status = http.StatusUnprocessableEntity
		}
		if len(p.Items) == httpjson.ProblemItemsMax {
			p.Omitted++
			continue
		}
		errs, omitted := httpjson.FieldsListed(ip.Errors, httpjson.ItemErrorsMax)
		p.Items = append(p.Items, httpjson.ItemProblem{Index: i, Status: ip.Status, Code: ip.Code, Detail: ip.Detail,
			Errors: errs, Omitted: ip.Omitted + omitted})
	}
	httpjson.WriteProblem(w, r, p)
}

// usageResultOf is the metrics result of a recorded event.
func usageResultOf(res *ledger.UsageEventResult) string {
	if res.Replay {
		return metrics.UsageReplayed
	}
	return metrics.UsageCreated
}

// usageResult is the metrics result of an event refused with err, or ""
// for an internal error (counted by the request's 5xx instead).
func usageResult(err error) string {
	var ce *ledger.ConflictError
	var ve *ledger.ValidationError
	var de *httpjson.DecodeError
	switch {
	case errors.As(err, &ce) && ce.Code == ledger.ConflictIdempotency:
		return metrics.UsageConflict
	case errors.As(err, &ce) && ce.Code == ledger.ConflictPeriodClosed:
		return metrics.UsagePeriodClosed
	case errors.As(err, &ve), errors.As(err, &de), errors.As(err, new(*ledger.UnpricedMetricError)):
		return metrics.UsageRejected
	}
	return ""
}
