package httpjson

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// event holds the fields of a usage event that TestDecodeStrictUnknownKeysMemory
// sends.
type event struct {
	CustomerID  string `json:"customer_id"`
	EventID     string `json:"event_id"`
	AmountCents *int64 `json:"amount_cents"`
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
	for ; sb.Len() < BodyLimitDefault-64; keys++ {
		fmt.Fprintf(&sb, `,"k%06d":0`, keys)
	}
	sb.WriteString("}")
	body := []byte(sb.String())

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := DecodeStrict[event](body, "")
	runtime.ReadMemStats(&after)

	var de *DecodeError
	require.ErrorAs(t, err, &de)
	require.Len(t, de.Fields, problemErrorsMax)
	require.Equal(t, keys-problemErrorsMax, de.Omitted)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20), "bytes allocated to decode %d bytes", len(body))
}
