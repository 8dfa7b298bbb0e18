package ledger_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

func TestUsageEventProperties(t *testing.T) {
	t.Parallel()

	t.Run("Canonical", func(t *testing.T) {
		t.Parallel()
		for raw, want := range map[string]string{
			``:                                 `{}`,
			` null `:                           `{}`,
			`{}`:                               `{}`,
			`{"b":1,"a":{"z":true,"y":[1,2]}}`: `{"a":{"y":[1,2],"z":true},"b":1}`,
			// Numbers stay as written: the hash of events stored before
			// these bounds must not change.
			`{"x":1E+2,"y":1.50,"z":-0}`: `{"x":1E+2,"y":1.50,"z":-0}`,
		} {
			got, err := ledger.UsageEventProperties(json.RawMessage(raw))
			require.NoError(t, err, raw)
			require.Equal(t, want, string(got), raw)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			raw, field, says string
		}{
			{`[1,2]`, "properties", "JSON object"},
			{`{"a":"x\u0000"}`, "properties", "NUL"},
			{`{"\u0000":1}`, "properties", "NUL"},
			{`{"x":1e131071}`, "properties.x", "exponent"},
			{`{"x":1e1000000}`, "properties.x", "exponent"},
			{`{"x":0e99999999999999999999}`, "properties.x", "exponent"},
			{`{"x":1e400}`, "properties.x", "float64"},
			{`{"x":1e401}`, "properties.x", "exponent"},
			{`{"x":2e308}`, "properties.x", "float64"},
			{`{"x":-1.8e308}`, "properties.x", "float64"},
			{`{"x":2e-324}`, "properties.x", "too small"},
			{`{"x":0.` + strings.Repeat("0", 330) + `1}`, "properties.x", "too small"},
			{`{"x":123456789012345678}`, "properties.x", "18 significant digits"},
			{`{"x":0.123456789012345678}`, "properties.x", "18 significant digits"},
			{`{"x":1.` + strings.Repeat("0", 341) + `}`, "properties.x", "341 digits after the decimal point"},
			{`{"x":0e-341}`, "properties.x", "341 digits after the decimal point"},
			{`{"a":[1,{"b":1e999}]}`, "properties.a[1].b", "exponent"},
			{`{"a b":1e999}`, `properties["a b"]`, "exponent"},
			{`{"pad":"` + strings.Repeat("p", 16<<10) + `"}`, "properties", "at most 16384"},
		} {
			_, err := ledger.UsageEventProperties(json.RawMessage(tc.raw))
			var ve *ledger.ValidationError
			require.ErrorAs(t, err, &ve, "%.80s", tc.raw)
			require.Len(t, ve.Fields, 1, "%.80s: %v", tc.raw, ve.Fields)
			require.Contains(t, ve.Fields[tc.field], tc.says, "%.80s: %v", tc.raw, ve.Fields)
		}
	})

	t.Run("LongKeyIsCutInThePath", func(t *testing.T) {
		t.Parallel()
		key := strings.Repeat("k", 1000)
		_, err := ledger.UsageEventProperties(json.RawMessage(`{"` + key + `":1e999}`))
		var ve *ledger.ValidationError
		require.ErrorAs(t, err, &ve)
		for field := range ve.Fields {
			require.Less(t, len(field), 100, field)
			require.True(t, strings.HasPrefix(field, `properties["kkkk`), field)
		}
	})
}

// TestUsageEventPropertiesDeepPath requires that a bad number deep in
// properties costs memory in proportion to the body: its path written at
// every level allocated 412 MB for these 185 KB. It measures the process's
// allocations, so it runs alone (not in parallel).
func TestUsageEventPropertiesDeepPath(t *testing.T) {
	key := strings.Repeat("p", 32)
	raw := strings.Repeat(`{"`+key+`":`, 5000) + "1e999" + strings.Repeat("}", 5000)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ledger.UsageEventProperties(json.RawMessage(raw))
	runtime.ReadMemStats(&after)

	var ve *ledger.ValidationError
	require.ErrorAs(t, err, &ve)
	want := "properties" + strings.Repeat("."+key, 5000)
	require.Contains(t, ve.Fields, want)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "bytes allocated for %d bytes of properties", len(raw))
}

// TestUsageEventRecordPropertiesSize checks the 16 KiB bound against what
// Postgres stores: for each form of number, properties that are exactly
// UsageEventPropertiesMaxBytes as Postgres writes them are taken and one byte
// more is refused, so the ledger counts each number as Postgres writes it.
func TestUsageEventRecordPropertiesSize(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	for i, n := range []string{
		`1`, `-0`, `-0.0`, `0.10`, `1E+2`, `123.456e1`, `100e-2`, `0e-5`, `-2.5e-3`, `1.5e-7`, `1e300`,
		`1.7976931348623157e308`, `-4.9406564584124654e-324`, `5e-324`, `123456789012345670000`, `0.000`,
	} {
		var printed string
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT ($1::jsonb -> 'n')::text`, `{"n":`+n+`}`).Scan(&printed))
		// {"n":N,"pad":"P"} is 15 bytes plus N as printed plus the pad.
		pad := ledger.UsageEventPropertiesMaxBytes - 15 - len(printed)
		props := func(pad int) json.RawMessage {
			return json.RawMessage(`{"n":` + n + `,"pad":"` + strings.Repeat("p", pad) + `"}`)
		}

		ev := event(fmt.Sprintf("at%d", i), 1)
		ev.Properties = props(pad)
		res, err := b.Ledger.UsageEventRecord(ctx, ev)
		require.NoError(t, err, "%s is %d bytes in Postgres", n, len(printed))
		var compact bytes.Buffer
		require.NoError(t, json.Compact(&compact, res.Event.Properties))
		require.Equal(t, ledger.UsageEventPropertiesMaxBytes, compact.Len(), "%s", n)

		ev = event(fmt.Sprintf("over%d", i), 1)
		ev.Properties = props(pad + 1)
		_, err = b.Ledger.UsageEventRecord(ctx, ev)
		requireInvalid(t, err, "properties")
	}
}
