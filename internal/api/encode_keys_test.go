package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// tokenKeys reads the keys of raw's top-level object with encoding/json's
// tokenizer: the reference objectKeys must agree with.
func tokenKeys(raw []byte) ([]string, bool) {
	if !json.Valid(raw) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, false
		}
	}
	return keys, true
}

// FuzzObjectKeys holds decodeStrict's fast path to encoding/json: for any input,
// objectKeys yields exactly the keys the tokenizer reads (none when it
// refuses), and accepts exactly the valid JSON objects.
func FuzzObjectKeys(f *testing.F) {
	for _, seed := range []string{
		`{}`, ` { } `, `{"a":1}`, `{"a":1,"b":"x"}`, `{"a":{"b":[1,{"c":"}"}]},"d":"\"}"}`,
		`{"a\u0062":true,"c\\d":null,"e\"f":-1.5e3}`, `{"a":"x","a":"y"}`, `[1,2]`, `"s"`, `{"a":}`,
		`{"customer_id":"acme","event_id":"e1","amount_cents":100,"properties":{"k":[1,2,{"x":"]"}]}}`,
		"{\"a\":\t[ ]\n,\r\"b\" : { } }", `{"a":1}x`, `{"\ud800":1}`, "{\"\xff\":1}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var got []string
		gotOK := objectKeys(raw, func(key []byte) { got = append(got, string(key)) })
		want, wantOK := tokenKeys(raw)
		if gotOK != wantOK || !slices.Equal(got, want) {
			t.Fatalf("objectKeys(%q) = %q, %v; the tokenizer reads %q, %v", raw, got, gotOK, want, wantOK)
		}
	})
}

// TestDecodeStrictUnknownKeysMemory requires that an event of 1 MiB with
// tens of thousands of unknown keys costs memory in proportion to the keys it
// names, not to all it holds: a token, a skipped value and a message per key
// allocated 47 MB. It measures the process's allocations, so it runs alone
// (not in parallel).
func TestDecodeStrictUnknownKeysMemory(t *testing.T) {
	var sb strings.Builder
	sb.WriteString(`{"customer_id":"acme","event_id":"e1","amount_cents":1`)
	keys := 0
	for ; sb.Len() < bodyLimitDefault-64; keys++ {
		fmt.Fprintf(&sb, `,"k%06d":0`, keys)
	}
	sb.WriteString("}")
	body := []byte(sb.String())

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := decodeStrict[usageEventRequest](body, "")
	runtime.ReadMemStats(&after)

	var de *decodeError
	require.ErrorAs(t, err, &de)
	require.Len(t, de.fields, problemErrorsMax)
	require.Equal(t, keys-problemErrorsMax, de.omitted)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20), "bytes allocated to decode %d bytes", len(body))
}
