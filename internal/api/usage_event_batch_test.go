package api_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// batchBody is a successful batch answer.
type batchBody struct {
	Created  int `json:"created"`
	Replayed int `json:"replayed"`
	Data     []struct {
		Status string         `json:"status"`
		Event  usageEventBody `json:"event"`
	} `json:"data"`
}

// batchJSON wraps events in a batch request.
func batchJSON(events ...string) string {
	return `{"events":[` + strings.Join(events, ",") + `]}`
}

func (b *testBundle) postBatch(body string) *httptest.ResponseRecorder {
	return b.do(http.MethodPost, "/v1/usage-events/batch", body)
}

// requireBatchRejected posts body as a batch, requires that nothing was
// written, and returns the response.
func (b *testBundle) requireBatchRejected(t *testing.T, body string) *httptest.ResponseRecorder {
	t.Helper()
	return b.requireNothingWritten(t, b.newRequest(http.MethodPost, "/v1/usage-events/batch", body))
}

// requireItem requires p to hold a problem for item index with status and
// code, and returns it.
func requireItem(t *testing.T, p problemBody, index, status int, code string) itemProblemBody {
	t.Helper()
	for _, it := range p.Items {
		if it.Index == index {
			require.Equal(t, status, it.Status, "item %d: %+v", index, it)
			require.Equal(t, code, it.Code, "item %d: %+v", index, it)
			require.NotEmpty(t, it.Detail)
			return it
		}
	}
	require.Failf(t, "no problem for item", "index %d; items: %+v", index, p.Items)
	return itemProblemBody{}
}

func TestUsageEventBatch(t *testing.T) {
	t.Parallel()

	t.Run("AllReplays", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		body := batchJSON(eventJSON("e1", 1), eventJSON("e2", 2))
		first := b.postBatch(body)
		require.Equal(t, http.StatusCreated, first.Code, "body: %s", first.Body)

		before := b.rows(t)
		rec := b.postBatch(body)
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		res := decodeJSON[batchBody](t, rec)
		require.Equal(t, 0, res.Created)
		require.Equal(t, 2, res.Replayed)
		require.Len(t, res.Data, 2)
		for i, d := range res.Data {
			require.Equal(t, "replayed", d.Status)
			require.Equal(t, decodeJSON[batchBody](t, first).Data[i].Event, d.Event)
		}
		require.Equal(t, before, b.rows(t))
	})

	t.Run("BodyTooLarge", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		big := `{"customer_id":"acme","event_id":"e1","amount_cents":1,"metric":"` + strings.Repeat("m", 8<<20) + `"}`
		requireProblem(t, b.requireBatchRejected(t, batchJSON(big)), http.StatusRequestEntityTooLarge, "body_too_large")
	})

	t.Run("BodyUnderLimitIsNotTooLarge", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		// About 2 MiB: over the single-event limit, under the batch limit.
		events := make([]string, 1000)
		for i := range events {
			events[i] = fmt.Sprintf(`{"customer_id":"acme","event_id":"e%04d","amount_cents":1,"properties":{"pad":%q}}`,
				i, strings.Repeat("p", 2000))
		}
		body := batchJSON(events...)
		require.Greater(t, len(body), 1<<20)
		rec := b.postBatch(body)
		require.Equal(t, http.StatusCreated, rec.Code, "body: %.500s", rec.Body)
		require.Equal(t, int64(1000), b.rows(t).Events)
	})

	t.Run("ConflictRejectsWholeBatch", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("taken", 5)).Code)
		b.Customer(t, "beta")

		rec := b.requireBatchRejected(t, batchJSON(
			eventJSON("new", 1),
			`{"customer_id":"beta","event_id":"b1","amount_cents":1}`,
			eventJSON("taken", 6),
		))
		p := requireProblem(t, rec, http.StatusConflict, "batch_rejected")
		require.Len(t, p.Items, 1)
		requireItem(t, p, 2, http.StatusConflict, "idempotency_conflict")
	})

	t.Run("DuplicateInBatchIsReplay", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.postBatch(batchJSON(eventJSON("x", 10), eventJSON("y", 20), eventJSON("x", 10)))
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		res := decodeJSON[batchBody](t, rec)
		require.Equal(t, 2, res.Created)
		require.Equal(t, 1, res.Replayed)
		require.Equal(t, []string{"created", "created", "replayed"},
			[]string{res.Data[0].Status, res.Data[1].Status, res.Data[2].Status})
		require.Equal(t, res.Data[0].Event, res.Data[2].Event)
		require.Equal(t, int64(2), b.rows(t).Events)

		// A duplicate with another payload conflicts, and nothing is written.
		p := requireProblem(t, b.requireBatchRejected(t, batchJSON(eventJSON("z", 1), eventJSON("z", 2))),
			http.StatusConflict, "batch_rejected")
		requireItem(t, p, 1, http.StatusConflict, "idempotency_conflict")
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, body := range []string{`{"events":[]}`, `{"events":null}`, `{}`} {
			requireInvalid(t, b.requireBatchRejected(t, body), "events")
		}
	})

	t.Run("InvalidAndConflictingItems", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("taken", 5)).Code)
		rec := b.requireBatchRejected(t, batchJSON(
			eventJSON("ok", 1),
			eventJSON("taken", 6),
			eventJSON("zero", 0),
			`{"customer_id":"ghost","event_id":"g1","amount_cents":1}`,
		))
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "batch_rejected")
		require.Len(t, p.Items, 3)
		require.Equal(t, []int{1, 2, 3}, []int{p.Items[0].Index, p.Items[1].Index, p.Items[2].Index}, "items sorted by index")
		requireItem(t, p, 1, http.StatusConflict, "idempotency_conflict")
		require.Contains(t, requireItem(t, p, 2, http.StatusUnprocessableEntity, "validation_error").Errors, "amount_cents")
		require.Contains(t, requireItem(t, p, 3, http.StatusUnprocessableEntity, "validation_error").Errors, "customer_id")
	})

	t.Run("InvalidItemRejectsWholeBatch", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		b.Customer(t, "beta")
		rec := b.requireBatchRejected(t, batchJSON(
			eventJSON("ok", 1),
			`{"customer_id":"beta","event_id":"b1","amount_cents":1}`,
			`{"customer_id":"acme","event_id":"eur","amount_cents":1,"currency":"eur"}`,
		))
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "batch_rejected")
		require.Len(t, p.Items, 1)
		require.Contains(t, requireItem(t, p, 2, http.StatusUnprocessableEntity, "validation_error").Errors, "currency")
	})

	t.Run("MalformedItemRejectsWholeBatch", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, bad := range []string{
			`{"customer_id":"acme","event_id":"bad","amount_cents":"12"}`,
			`{"customer_id":"acme","event_id":"bad"}`,
			`{"customer_id":"acme","event_id":"bad","amount_cents":1,"occurred_at":"yesterday"}`,
			`{"customer_id":"acme","event_id":"bad","amount_cents":1,"extra":true}`,
		} {
			rec := b.requireBatchRejected(t, batchJSON(eventJSON("ok", 1), bad, eventJSON("ok2", 2)))
			p := requireProblem(t, rec, http.StatusUnprocessableEntity, "batch_rejected")
			require.Len(t, p.Items, 1)
			requireItem(t, p, 1, http.StatusUnprocessableEntity, "validation_error")
		}
	})

	t.Run("MalformedItemsReportedAtTheirIndex", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		// No item is well-formed and valid, so none reaches the ledger's commit.
		rec := b.requireBatchRejected(t, batchJSON(
			`{"customer_id":"acme","event_id":"bad","amount_cents":"12"}`,
			eventJSON("zero", 0),
			`{"customer_id":"acme","event_id":"extra","amount_cents":1,"extra":true}`,
			`{"customer_id":"acme","event_id":"missing"}`,
			`[1,2]`,
		))
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "batch_rejected")
		require.Len(t, p.Items, 5)
		require.Contains(t, requireItem(t, p, 0, http.StatusUnprocessableEntity, "validation_error").Errors, "amount_cents")
		require.Contains(t, requireItem(t, p, 1, http.StatusUnprocessableEntity, "validation_error").Errors, "amount_cents")
		require.Contains(t, requireItem(t, p, 2, http.StatusUnprocessableEntity, "validation_error").Errors, "extra")
		require.Contains(t, requireItem(t, p, 3, http.StatusUnprocessableEntity, "validation_error").Errors, "amount_cents")
		requireItem(t, p, 4, http.StatusUnprocessableEntity, "validation_error")
	})

	t.Run("MalformedJSON", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, body := range []string{`{"events":[`, `{"events":[{"customer_id":}]}`, `{"events":[]} []`} {
			requireProblem(t, b.requireBatchRejected(t, body), http.StatusBadRequest, "malformed_json")
		}
	})

	t.Run("Mixed", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		old := b.postEvent(eventJSON("old", 5))
		require.Equal(t, http.StatusCreated, old.Code)

		rec := b.postBatch(batchJSON(eventJSON("new", 7), eventJSON("old", 5)))
		require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
		res := decodeJSON[batchBody](t, rec)
		require.Equal(t, 1, res.Created)
		require.Equal(t, 1, res.Replayed)
		require.Equal(t, "created", res.Data[0].Status)
		require.Equal(t, "new", res.Data[0].Event.EventID)
		require.Equal(t, int64(7), res.Data[0].Event.AmountCents)
		require.Equal(t, "replayed", res.Data[1].Status)
		require.Equal(t, decodeJSON[usageEventBody](t, old), res.Data[1].Event)
		require.Equal(t, rows{Customers: 1, Events: 2, Periods: 1, Jobs: 1}, b.rows(t))
	})

	t.Run("TooManyEvents", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		events := make([]string, 1001)
		for i := range events {
			events[i] = eventJSON(fmt.Sprintf("e%04d", i), 1)
		}
		p := requireInvalid(t, b.requireBatchRejected(t, batchJSON(events...)), "events")
		require.Contains(t, p.Errors["events"], "1000")
	})

	t.Run("UnknownTopLevelField", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.requireBatchRejected(t, `{"events":[`+eventJSON("e1", 1)+`],"dry_run":true}`), "dry_run")
	})

	t.Run("UnsupportedMediaType", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodPost, "/v1/usage-events/batch", batchJSON(eventJSON("e1", 1)))
		req.Header.Set("Content-Type", "text/plain")
		requireProblem(t, b.requireNothingWritten(t, req), http.StatusUnsupportedMediaType, "unsupported_media_type")
	})
}
