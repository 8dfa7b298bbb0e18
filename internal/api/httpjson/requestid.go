package httpjson

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
)

type ctxKey int

const ctxKeyRequestID ctxKey = 0

// requestIDHeader carries the request id both ways: a client may send one
// (printable, at most 128 bytes) and every response has one.
const requestIDHeader = "X-Request-Id"

// RequestIDFrom returns the request id WithRequestID gave ctx's request, or
// "" outside it.
func RequestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(ctxKeyRequestID).(string)
	return id
}

// WithRequestID gives every request an id, the client's X-Request-Id when
// it sends a valid one, else a random req_…: it answers it in X-Request-Id
// and puts it in the request's context for RequestIDFrom (problems and logs
// name it).
func WithRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(requestIDHeader)
		if id == "" || len(id) > 128 || strings.ContainsFunc(id, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			b := make([]byte, 12)
			_, _ = rand.Read(b)
			id = "req_" + hex.EncodeToString(b)
		}
		w.Header().Set(requestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKeyRequestID, id)))
	})
}
