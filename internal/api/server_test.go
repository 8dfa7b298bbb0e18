package api_test

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// testServe serves an unauthenticated request without a body through h.
func testServe(h http.Handler, method, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

func TestNotFound(t *testing.T) {
	t.Parallel()

	t.Run("UnknownRoute", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, path := range []string{"/", "/v1", "/v1/customers", "/v2/usage-events", "/v1/customers/acme/periods/2026-11/extra"} {
			p := requireProblem(t, b.do(http.MethodGet, path, ""), http.StatusNotFound, "not_found")
			require.Contains(t, p.Detail, path)
		}
	})

	t.Run("UnknownRouteWithoutKey", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireProblem(t, testServe(b.handler, http.MethodGet, "/nope"), http.StatusNotFound, "not_found")
	})
}

func TestRequestID(t *testing.T) {
	t.Parallel()

	generated := regexp.MustCompile(`^req_[0-9a-f]{24}$`)

	t.Run("Echoed", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		req := b.newRequest(http.MethodGet, "/v1/customers/ghost", "")
		req.Header.Set("X-Request-Id", "client-id-42")
		rec := b.serve(req)
		require.Equal(t, "client-id-42", rec.Header().Get("X-Request-Id"))
		p := requireProblem(t, rec, http.StatusNotFound, "not_found")
		require.Equal(t, "client-id-42", p.RequestID)
	})

	t.Run("GeneratedWhenMissing", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		first := testServe(b.handler, http.MethodGet, "/healthz").Header().Get("X-Request-Id")
		second := testServe(b.handler, http.MethodGet, "/healthz").Header().Get("X-Request-Id")
		require.Regexp(t, generated, first)
		require.Regexp(t, generated, second)
		require.NotEqual(t, first, second)
	})

	t.Run("ReplacedWhenInvalid", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		for _, id := range []string{strings.Repeat("x", 129), "has space", "tab\there", "ünicode"} {
			req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
			req.Header.Set("X-Request-Id", id)
			rec := b.serve(req)
			require.Regexp(t, generated, rec.Header().Get("X-Request-Id"), "sent %q", id)
		}
		req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
		req.Header.Set("X-Request-Id", strings.Repeat("x", 128))
		require.Equal(t, strings.Repeat("x", 128), b.serve(req).Header().Get("X-Request-Id"))
	})
}
