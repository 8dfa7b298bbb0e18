package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// eventWithProperties is a valid usage event of acme with properties props.
func eventWithProperties(eventID, props string) string {
	return fmt.Sprintf(`{"customer_id":"acme","event_id":%q,"amount_cents":1,"properties":%s}`, eventID, props)
}

// amplifyingProperties is about 8 KB of numbers that Postgres writes out in
// full: 1e131071 is 131,072 digits as jsonb keeps it.
func amplifyingProperties() string {
	var sb strings.Builder
	sb.WriteString("{")
	for i := 0; sb.Len() < 8000; i++ {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `"k%d":1e131071`, i)
	}
	sb.WriteString("}")
	return sb.String()
}

// Numbers a float64 cannot hold, each with the reason it is refused.
var numbersBeyondFloat64 = []string{
	`1e131071`,                      // 131,072 digits as stored
	`1e1000000`,                     // beyond Postgres's numeric: was a 500
	`-1e309`,                        // beyond the float64 range
	`1e-400`,                        // rounds to 0
	`0e-20000`,                      // 20,000 zeros after the point: was a 500
	`0e99999999`,                    // an absurd exponent
	`12345678901234567890123`,       // more digits than a float64 holds
	`1.` + strings.Repeat("0", 400), // 400 digits after the point
}

func TestUsageEventProperties(t *testing.T) {
	t.Parallel()

	t.Run("AmplificationRefused", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		body := eventWithProperties("e1", amplifyingProperties())
		require.Less(t, len(body), 8200)
		rec := b.requireEventRejected(t, body)
		// It was 201 with a 65,933,342-byte body (and as much on every replay).
		require.Less(t, rec.Body.Len(), 1024, "the answer is small: %s", rec.Body)
		p := requireInvalid(t, rec, "properties.k0")
		require.Contains(t, p.Errors["properties.k0"], "1e131071")
	})

	t.Run("BatchItemsBeyondFloat64", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		events := []string{eventJSON("ok", 1)}
		for i, n := range numbersBeyondFloat64 {
			events = append(events, eventWithProperties(fmt.Sprintf("e%d", i), `{"x":`+n+`}`))
		}
		rec := b.requireBatchRejected(t, batchJSON(events...))
		require.Less(t, rec.Body.Len(), 8192)
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "batch_rejected")
		require.Len(t, p.Items, len(numbersBeyondFloat64), "items: %+v", p.Items)
		for i, n := range numbersBeyondFloat64 {
			it := requireItem(t, p, i+1, http.StatusUnprocessableEntity, "validation_error")
			require.Contains(t, it.Errors, "properties.x", "%s: %+v", n, it)
		}
	})

	t.Run("BatchOfAmplifyingItems", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		events := make([]string, 100)
		for i := range events {
			events[i] = eventWithProperties(fmt.Sprintf("e%d", i), amplifyingProperties())
		}
		rec := b.requireBatchRejected(t, batchJSON(events...))
		p := requireProblem(t, rec, http.StatusUnprocessableEntity, "batch_rejected")
		require.Len(t, p.Items, 10, "the first 10 failing events")
		require.Equal(t, 90, p.Omitted, "the other failing events")
		require.Contains(t, p.Items[0].Errors, "properties.k0")
	})

	t.Run("NumbersBeyondFloat64", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, n := range numbersBeyondFloat64 {
			rec := b.requireEventRejected(t, eventWithProperties("e1", `{"x":`+n+`}`))
			p := requireInvalid(t, rec, "properties.x")
			require.Len(t, p.Errors, 1, "%s: %v", n, p.Errors)
		}
	})

	t.Run("NumbersFloat64Holds", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for i, n := range []string{
			`0`, `-0`, `1`, `-1.5`, `0.1`, `1E+2`, `2.5e-3`, `1.50`, `100e-2`,
			`12345678901234567`, `-9007199254740993`, `1.7976931348623157e308`, `-2.2250738585072014e-308`,
			`5e-324`, `4.9406564584124654e-324`, `123456789012345670000`,
		} {
			body := eventWithProperties(fmt.Sprintf("e%d", i), `{"x":`+n+`}`)
			rec := b.postEvent(body)
			require.Equal(t, http.StatusCreated, rec.Code, "%s: %s", n, rec.Body)
			replay := b.postEvent(body)
			require.Equal(t, http.StatusOK, replay.Code, "%s: %s", n, replay.Body)
			require.Equal(t, rec.Body.String(), replay.Body.String())
		}
	})

	t.Run("PathNamesTheNumber", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for props, field := range map[string]string{
			`{"a":{"b":[1,2,1e999]}}`:             "properties.a.b[2]",
			`{"z":1e999,"a":1e999}`:               "properties.a",
			`{"dotted.key":{"x y":[[1e-999]]}}`:   `properties["dotted.key"]["x y"][0][0]`,
			`{"n":1,"m":[{"deep":-1e400}],"a":1}`: "properties.m[0].deep",
		} {
			p := requireInvalid(t, b.requireEventRejected(t, eventWithProperties("e1", props)), field)
			require.Len(t, p.Errors, 1, "%s: %v", props, p.Errors)
		}
	})

	t.Run("SizeLimit", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		// {"pad":"…"} is 10 bytes plus the pad.
		at := `{"pad":"` + strings.Repeat("p", ledger.UsageEventPropertiesMaxBytes-10) + `"}`
		rec := b.postEvent(eventWithProperties("at", at))
		require.Equal(t, http.StatusCreated, rec.Code, "body: %.300s", rec.Body)
		over := `{"pad":"` + strings.Repeat("p", ledger.UsageEventPropertiesMaxBytes-9) + `"}`
		p := requireInvalid(t, b.requireEventRejected(t, eventWithProperties("over", over)), "properties")
		require.Contains(t, p.Errors["properties"], "16384")

		// Numbers count as Postgres stores them: 1e300 is 301 bytes, so 60
		// of them (about 1 KB as sent) are over the limit.
		var sb strings.Builder
		for i := range 60 {
			fmt.Fprintf(&sb, `,"n%02d":1e300`, i)
		}
		requireInvalid(t, b.requireEventRejected(t, eventWithProperties("numbers", `{`+sb.String()[1:]+`}`)), "properties")
	})
}
