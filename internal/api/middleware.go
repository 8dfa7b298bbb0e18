package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/metrics"
)

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
			slog.String("request_id", httpjson.RequestIDFrom(r.Context())),
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
				if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(v)
				}
				httpjson.WriteInternal(logger, w, r, fmt.Errorf("panic: %v\n%s", v, debug.Stack()))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// bearerToken returns the token of the request's "Authorization: Bearer
// <token>", or "".
func bearerToken(r *http.Request) string {
	scheme, token, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// requireToken lets through requests that send "Authorization: Bearer
// <token>" (compared in constant time), and answers 401 to the others.
func requireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(bearerToken(r)))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tally-metrics"`)
			httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusUnauthorized, Code: "unauthenticated",
				Detail: "send the metrics token (TALLY_METRICS_TOKEN) as Authorization: Bearer <token>"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authorize authenticates the API key secret (not empty), records it for the
// access log, and requires scope. When it refuses, it has answered: 401 with
// challenge and invalidDetail for an unknown or revoked key, 403 for a key
// without the scope, 500 when the key cannot be read.
func authorize(logger *slog.Logger, l *ledger.Ledger, w http.ResponseWriter, r *http.Request,
	secret string, scope ledger.Scope, challenge, invalidDetail string,
) bool {
	key, err := l.APIKeyAuthenticate(r.Context(), secret)
	if errors.Is(err, ledger.ErrUnauthenticated) {
		w.Header().Set("WWW-Authenticate", challenge)
		httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusUnauthorized, Code: "unauthenticated", Detail: invalidDetail})
		return false
	}
	if err != nil {
		httpjson.WriteInternal(logger, w, r, err)
		return false
	}
	if h, ok := r.Context().Value(ctxKeyHolder{}).(*keyHolder); ok {
		h.key = key
	}
	if !key.Has(scope) {
		httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusForbidden, Code: "forbidden",
			Detail: fmt.Sprintf("this API key lacks the %s scope that this request needs", scope)})
		return false
	}
	return true
}

// requireScope authenticates the request's bearer key and requires scope:
// 401 without a valid key, 403 without the scope.
func requireScope(logger *slog.Logger, l *ledger.Ledger, scope ledger.Scope, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret := bearerToken(r)
		if secret == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tally"`)
			httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusUnauthorized, Code: "unauthenticated",
				Detail: "send an API key as Authorization: Bearer <key>; create one with billingctl apikey create"})
			return
		}
		if authorize(logger, l, w, r, secret, scope, `Bearer realm="tally", error="invalid_token"`, "the API key is unknown or revoked") {
			next.ServeHTTP(w, r)
		}
	})
}

// riverUIRealm is the basic-auth realm a browser is asked to log in to for
// the River UI, and riverUILogin what a refused request is told.
const (
	riverUIRealm = `Basic realm="Tally River UI: any user name, an admin API key as the password", charset="UTF-8"`
	riverUILogin = "the River UI needs an API key with the admin scope: log in with any user name and the key as the password"
)

// requireAdminBasic is requireScope(admin) that also takes the key as the
// password of HTTP basic auth (what a browser sends after its login prompt),
// and challenges a request without a valid key to log in.
func requireAdminBasic(logger *slog.Logger, l *ledger.Ledger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret := bearerToken(r)
		if _, password, ok := r.BasicAuth(); ok {
			secret = password
		}
		if secret == "" {
			w.Header().Set("WWW-Authenticate", riverUIRealm)
			httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusUnauthorized, Code: "unauthenticated", Detail: riverUILogin})
			return
		}
		if authorize(logger, l, w, r, secret, ledger.ScopeAdmin, riverUIRealm, riverUILogin) {
			next.ServeHTTP(w, r)
		}
	})
}

// requireSameOrigin refuses, 403 cross_site_refused, a request that may
// change state (any method but GET, HEAD and OPTIONS) unless it came from a
// page of this site. It guards what a browser authenticates by itself (the
// River UI's basic auth): a page elsewhere can make a logged-in browser send
// a form or a simple fetch here, but not with this host as its Origin, not
// with Sec-Fetch-Site: same-origin, and not as Content-Type:
// application/json (that needs a CORS preflight, which is never answered).
// So an Origin must be this request's host, a Sec-Fetch-Site must be
// same-origin, and a request with neither (a client such as curl; every
// current browser sends one of them) must be JSON. The River UI's own
// requests pass: same-origin fetches, whose JSON bodies go as text/plain.
func requireSameOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if detail := crossSite(r); detail != "" {
			httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusForbidden, Code: "cross_site_refused",
				Detail: "refused: " + detail + "; the River UI changes state only for requests from its own pages"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// crossSite says what makes r a request requireSameOrigin refuses, or "".
func crossSite(r *http.Request) string {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return ""
	}
	origin, site := r.Header.Get("Origin"), r.Header.Get("Sec-Fetch-Site")
	if origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Sprintf("the request's Origin %q is not this site (%s)", origin, r.Host)
		}
	}
	if site != "" && site != "same-origin" {
		return fmt.Sprintf("the browser says the request comes from another page than this site's (Sec-Fetch-Site: %s)", site)
	}
	if origin == "" && site == "" {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			return fmt.Sprintf("a request without Origin or Sec-Fetch-Site must send Content-Type: application/json (a form on another site cannot), not %q",
				r.Header.Get("Content-Type"))
		}
	}
	return ""
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
