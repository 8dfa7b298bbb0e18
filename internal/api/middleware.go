package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/metrics"
)

type ctxKey int

const ctxKeyRequestID ctxKey = 0

// requestIDHeader carries the request id both ways: a client may send one
// (printable, at most 128 bytes) and every response has one.
const requestIDHeader = "X-Request-Id"

func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(ctxKeyRequestID).(string)
	return id
}

func withRequestID(next http.Handler) http.Handler {
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

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// withAccessLog logs a line per request and counts it in m by the route
// pattern that served it.
func withAccessLog(logger *slog.Logger, m *metrics.Metrics, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		// requireScope puts the authenticated key in the holder for this line.
		holder := &keyHolder{}
		inner := r.WithContext(context.WithValue(r.Context(), ctxKeyHolder{}, holder))
		next.ServeHTTP(rec, inner) // the mux sets inner.Pattern
		took := time.Since(start)
		m.ObserveHTTP(inner.Pattern, r.Method, rec.status, took)
		attrs := []slog.Attr{
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", rec.status), slog.Duration("duration", took),
			slog.String("request_id", requestIDFrom(r.Context())),
		}
		if holder.key != nil {
			attrs = append(attrs, slog.String("key_prefix", holder.key.Prefix))
		}
		logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
	})
}

type ctxKeyHolder struct{}

// actorFrom names the operator behind a request for the ledger's audit
// columns (transitions, operator actions): operator:<key name>/<key prefix>,
// such as operator:ops-alice/tly_0a1b2c3d4e. The name says who; the prefix
// tells apart keys that share a name. A request that reached no key (which
// requireScope prevents) is operator:unknown.
func actorFrom(r *http.Request) string {
	if h, ok := r.Context().Value(ctxKeyHolder{}).(*keyHolder); ok && h.key != nil {
		return "operator:" + h.key.Name + "/" + h.key.Prefix
	}
	return "operator:unknown"
}

type keyHolder struct{ key *ledger.APIKey }

func withRecover(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				writeInternal(logger, w, r, fmt.Errorf("panic: %v\n%s", v, debug.Stack()))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// requireScope authenticates the request's bearer key and requires scope:
// 401 without a valid key, 403 without the scope.
// requireToken lets through requests that send "Authorization: Bearer
// <token>" (compared in constant time), and answers 401 to the others.
func requireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, secret, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		got := sha256.Sum256([]byte(strings.TrimSpace(secret)))
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tally-metrics"`)
			writeProblem(w, r, problem{Status: http.StatusUnauthorized, Code: "unauthenticated",
				Detail: "send the metrics token (TALLY_METRICS_TOKEN) as Authorization: Bearer <token>"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// riverUIRealm is the basic-auth realm a browser is asked to log in to for
// the River UI.
const riverUIRealm = `Basic realm="Tally River UI: any user name, an admin API key as the password", charset="UTF-8"`

// requireAdminBasic lets through requests that carry an API key with the
// admin scope, as a bearer token or as the password of HTTP basic auth (what
// a browser sends after its login prompt), and answers 401 with a basic-auth
// challenge, or 403 for a key without the scope, to the others.
func requireAdminBasic(logger *slog.Logger, l *ledger.Ledger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret, ok := "", false
		if _, password, basic := r.BasicAuth(); basic {
			secret, ok = password, password != ""
		} else if scheme, token, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " "); strings.EqualFold(scheme, "Bearer") {
			secret, ok = strings.TrimSpace(token), strings.TrimSpace(token) != ""
		}
		var key *ledger.APIKey
		var err error
		if ok {
			key, err = l.APIKeyAuthenticate(r.Context(), secret)
		}
		switch {
		case !ok || errors.Is(err, ledger.ErrUnauthenticated):
			w.Header().Set("WWW-Authenticate", riverUIRealm)
			writeProblem(w, r, problem{Status: http.StatusUnauthorized, Code: "unauthenticated",
				Detail: "the River UI needs an API key with the admin scope: log in with any user name and the key as the password"})
			return
		case err != nil:
			writeInternal(logger, w, r, err)
			return
		case !key.Has(ledger.ScopeAdmin):
			writeProblem(w, r, problem{Status: http.StatusForbidden, Code: "forbidden",
				Detail: "the River UI needs an API key with the admin scope"})
			return
		}
		if h, ok := r.Context().Value(ctxKeyHolder{}).(*keyHolder); ok {
			h.key = key
		}
		next.ServeHTTP(w, r)
	})
}

// handleRiverUILogin sends a browser that just logged in (basic auth) on to
// the UI page ?next= names (under /riverui/; default the UI's home) by an
// absolute URL without the credentials a login link may carry
// (http://user:key@host/riverui/login): a page whose address holds
// credentials may not fetch, and the browser keeps the login for the realm.
func handleRiverUILogin() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next := r.URL.Query().Get("next")
		if !strings.HasPrefix(next, "/riverui/") || strings.HasPrefix(next, "/riverui/login") || strings.ContainsAny(next, "\\\r\n") {
			next = "/riverui/"
		}
		scheme := "http"
		if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
			scheme = "https"
		}
		http.Redirect(w, r, scheme+"://"+r.Host+next, http.StatusSeeOther)
	})
}

func requireScope(logger *slog.Logger, l *ledger.Ledger, scope ledger.Scope, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, secret, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
		if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(secret) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tally"`)
			writeProblem(w, r, problem{Status: http.StatusUnauthorized, Code: "unauthenticated",
				Detail: "send an API key as Authorization: Bearer <key>; create one with billingctl apikey create"})
			return
		}
		key, err := l.APIKeyAuthenticate(r.Context(), strings.TrimSpace(secret))
		if err == ledger.ErrUnauthenticated {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tally", error="invalid_token"`)
			writeProblem(w, r, problem{Status: http.StatusUnauthorized, Code: "unauthenticated",
				Detail: "the API key is unknown or revoked"})
			return
		}
		if err != nil {
			writeInternal(logger, w, r, err)
			return
		}
		if h, ok := r.Context().Value(ctxKeyHolder{}).(*keyHolder); ok {
			h.key = key
		}
		if !key.Has(scope) {
			writeProblem(w, r, problem{Status: http.StatusForbidden, Code: "forbidden",
				Detail: fmt.Sprintf("this API key lacks the %s scope that this request needs", scope)})
			return
		}
		next.ServeHTTP(w, r)
	})
}
