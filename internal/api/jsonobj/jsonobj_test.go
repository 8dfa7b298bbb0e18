package jsonobj

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

// tokenKeys reads the keys of raw's top-level object with encoding/json's
// tokenizer: the reference Keys must agree with.
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

// FuzzObjectKeys holds Keys, internal/api's decodeStrict's fast path, to
// encoding/json: for any input, Keys yields exactly the keys the tokenizer
// reads (none when it refuses), and accepts exactly the valid JSON objects.
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
		gotOK := Keys(raw, func(key []byte) { got = append(got, string(key)) })
		want, wantOK := tokenKeys(raw)
		if gotOK != wantOK || !slices.Equal(got, want) {
			t.Fatalf("Keys(%q) = %q, %v; the tokenizer reads %q, %v", raw, got, gotOK, want, wantOK)
		}
	})
}
