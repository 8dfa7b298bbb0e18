// Package jsonobj reads the keys of a JSON object in one allocation-free
// scan: the API's strict decoding (httpjson.DecodeStrict) judges a request's
// fields with it before decoding them. It imports only the standard
// library, so its fuzz target's build is small.
package jsonobj

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// Keys calls yield with each key of the object raw holds, in order, and
// reports true, when raw is valid JSON holding one object; otherwise it
// reports false without calling yield. Keys are as encoding/json reads them
// (escapes decoded, invalid UTF-8 as U+FFFD); nothing is allocated but
// escaped or non-ASCII keys (yield must not keep key).
func Keys(raw []byte, yield func(key []byte)) bool {
	if !json.Valid(raw) {
		return false
	}
	i := skipSpace(raw, 0)
	if raw[i] != '{' {
		return false
	}
	i = skipSpace(raw, i+1)
	for raw[i] != '}' {
		if raw[i] == ',' {
			i = skipSpace(raw, i+1)
		}
		end := stringEnd(raw, i)
		key := raw[i+1 : end-1]
		if bytes.ContainsFunc(key, func(r rune) bool { return r == '\\' || r >= utf8.RuneSelf }) {
			// Escapes and non-ASCII as encoding/json reads them (invalid
			// UTF-8 becomes U+FFFD).
			var s string
			if err := json.Unmarshal(raw[i:end], &s); err != nil {
				return false
			}
			key = []byte(s)
		}
		yield(key)
		i = skipSpace(raw, end)                // at ':'
		i = valueEnd(raw, skipSpace(raw, i+1)) // after the value
		i = skipSpace(raw, i)
	}
	return true
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the string of valid JSON that opens at
// i.
func stringEnd(raw []byte, i int) int {
	for i++; raw[i] != '"'; i++ {
		if raw[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// valueEnd returns the index after the value of valid JSON that starts at
// i.
func valueEnd(raw []byte, i int) int {
	switch raw[i] {
	case '"':
		return stringEnd(raw, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch raw[i] {
			case '"':
				i = stringEnd(raw, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for i < len(raw) && !strings.ContainsRune(",}] \t\r\n", rune(raw[i])) {
		i++
	}
	return i
}
