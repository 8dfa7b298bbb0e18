package api_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	apispec "github.com/tally-billing/tally/apispec"
	"github.com/tally-billing/tally/apispec/apispectest"
	"github.com/tally-billing/tally/internal/ledger"
)

// TestOpenAPI holds apispec/openapi.yaml to the code where no answer shows it
// (every answer of every API test is checked against the document by
// newServer): the document describes exactly the routes of routes.go, with
// their auth, the ledger's statuses and held reasons, and every problem code;
// and GET /openapi.yaml serves it.
func TestOpenAPI(t *testing.T) {
	t.Parallel()

	// Enums: the document's lists of charge statuses and held reasons are the
	// ledger's.
	t.Run("Enums", func(t *testing.T) {
		t.Parallel()
		c, err := apispectest.Load()
		require.NoError(t, err)
		enum := func(name string) []string {
			var values []string
			for _, n := range c.Model.Components.Schemas.GetOrZero(name).Schema().Enum {
				values = append(values, n.Value)
			}
			return values
		}
		var statuses, reasons []string
		for _, s := range ledger.ChargeStatuses {
			statuses = append(statuses, string(s))
		}
		for _, r := range ledger.HeldReasons {
			reasons = append(reasons, string(r))
		}
		require.Equal(t, statuses, enum("ChargeStatus"))
		require.Equal(t, reasons, enum("HeldReason"))
	})

	// ProblemCodes: the document's problem codes are the codes the API
	// answers: every code: field set to a string literal in this package,
	// and the ledger's conflict codes (its Conflict… constants).
	t.Run("ProblemCodes", func(t *testing.T) {
		t.Parallel()
		c, err := apispectest.Load()
		require.NoError(t, err)
		var documented []string
		for _, n := range c.Model.Components.Schemas.GetOrZero("Problem").Schema().Properties.GetOrZero("code").Schema().Enum {
			documented = append(documented, n.Value)
		}
		answered := problemCodes(t)
		slices.Sort(documented)
		require.Equal(t, answered, documented, "the codes of Problem.code in apispec/openapi.yaml")
	})

	// Routes: every route of routes.go is an operation of the document, with
	// the auth routes.go gives it, and every operation of the document is
	// routed. The routes are read from routes.go itself (every mux.Handle
	// with a literal pattern), not from a list kept by hand. Two patterns are
	// not operations: "/", the catch-all that answers 404 not_found to
	// anything else (apispectest checks those answers), and "/riverui/",
	// River UI's own subtree of pages and JSON API, which the document
	// describes by its home page alone (GET /riverui/), so that one operation
	// must reach it. GET /metrics and the River UI are routed only when
	// configured; the document describes them with that condition.
	t.Run("Routes", func(t *testing.T) {
		t.Parallel()
		c, err := apispectest.Load()
		require.NoError(t, err)
		routes := routesOf(t, "routes.go")

		mux := http.NewServeMux()
		for pattern := range routes {
			mux.Handle(pattern, http.NotFoundHandler())
		}
		wildcard := regexp.MustCompile(`\{[^}]+\}`)
		reached := map[string]bool{}
		for template, item := range c.Model.Paths.PathItems.FromOldest() {
			for method, op := range item.GetOperations().FromOldest() {
				method = strings.ToUpper(method)
				operation := method + " " + template
				// A request for the operation, with a value for each wildcard.
				req := httptest.NewRequest(method, wildcard.ReplaceAllString(template, "1"), nil)
				_, pattern := mux.Handler(req)
				require.NotEqual(t, "/", pattern, "%s is in apispec/openapi.yaml but not in routes.go", operation)
				if strings.Contains(pattern, " ") {
					require.Equal(t, operation, pattern, "%s of apispec/openapi.yaml is routed to another route", operation)
				}
				reached[pattern] = true

				r := routes[pattern]
				var security []string
				for _, req := range op.Security {
					for scheme, roles := range req.Requirements.FromOldest() {
						security = append(security, scheme+":"+strings.Join(roles, ","))
					}
				}
				slices.Sort(security)
				require.Equal(t, r.security, security, "the security of %s in apispec/openapi.yaml", operation)
				if r.handler != "" {
					want := strings.ToLower(r.handler[:1]) + r.handler[1:]
					require.Equal(t, want, op.OperationId, "the operationId of %s (served by %s in routes.go)", operation, r.handler)
				}
			}
		}
		for pattern := range routes {
			if pattern != "/" {
				require.True(t, reached[pattern], "routes.go routes %q, which apispec/openapi.yaml does not describe", pattern)
			}
		}
	})

	// Served: GET /openapi.yaml answers the document, without a key.
	t.Run("Served", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := testServe(b.handler, http.MethodGet, "/openapi.yaml")
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "application/yaml", rec.Header().Get("Content-Type"))
		require.Equal(t, apispec.Document(), rec.Body.Bytes())
		require.Contains(t, rec.Body.String(), "openapi: 3.1.0")
	})
}

// problemCodes returns, sorted, the string literals set as code (or Code) in
// the keyed composite literals (httpjson.Problem, httpjson.DecodeError) of
// the Go files of this package and of the packages below it (httpjson,
// ingest), with the values of internal/ledger's Conflict… constants.
func problemCodes(t *testing.T) []string {
	t.Helper()
	codes := map[string]bool{}
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	below, err := filepath.Glob(filepath.Join("*", "*.go"))
	require.NoError(t, err)
	files = append(files, below...)
	files = append(files, filepath.Join("..", "ledger", "errors.go"))
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.KeyValueExpr:
				if key, ok := n.Key.(*ast.Ident); ok && (key.Name == "code" || key.Name == "Code") {
					if lit, ok := n.Value.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						code, err := strconv.Unquote(lit.Value)
						require.NoError(t, err)
						codes[code] = true
					}
				}
			case *ast.ValueSpec:
				for i, name := range n.Names {
					if strings.HasPrefix(name.Name, "Conflict") && f.Name.Name == "ledger" {
						lit, ok := n.Values[i].(*ast.BasicLit)
						require.True(t, ok, "%s: ledger.%s must be a string literal", fset.Position(name.Pos()), name.Name)
						code, err := strconv.Unquote(lit.Value)
						require.NoError(t, err)
						codes[code] = true
					}
				}
			}
			return true
		})
	}
	sorted := slices.Sorted(maps.Keys(codes))
	require.Contains(t, sorted, "not_found")
	require.Contains(t, sorted, "period_closed")
	return sorted
}

// route is one mux.Handle of routes.go.
type route struct {
	// security is the requirement the document must give the route, as
	// scheme:roles: apiKey:<scope> behind auth (requireScope), apiKey:admin
	// or riverUIBasic:admin behind requireAdminBasic, metricsToken: behind
	// MetricsHandler; none for an open route.
	security []string

	// handler is the name of the function that serves the route: a
	// handle… function's without "handle", or ingest's (the operationId,
	// lower-cased first); empty for a handler of another kind (River UI's,
	// the metrics').
	handler string
}

// scopeNames are the ledger's scope constants by their name in routes.go.
var scopeNames = map[string]ledger.Scope{
	"ScopeUsageWrite":     ledger.ScopeUsageWrite,
	"ScopeCustomersWrite": ledger.ScopeCustomersWrite,
	"ScopeBillingRead":    ledger.ScopeBillingRead,
	"ScopeAdmin":          ledger.ScopeAdmin,
}

// routesOf parses the Go file path and returns its mux.Handle routes by
// pattern. A pattern that is not a string literal, or a handler wrapped in
// an unknown way, fails t.
func routesOf(t *testing.T, path string) map[string]route {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	require.NoError(t, err)
	routes := map[string]route{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Handle" || !isIdent(sel.X, "mux") {
			return true
		}
		require.Len(t, call.Args, 2, "%s", fset.Position(call.Pos()))
		lit, ok := call.Args[0].(*ast.BasicLit)
		require.True(t, ok && lit.Kind == token.STRING, "%s: mux.Handle's pattern must be a string literal", fset.Position(call.Pos()))
		pattern, err := strconv.Unquote(lit.Value)
		require.NoError(t, err)
		require.NotContains(t, routes, pattern)
		routes[pattern] = routeOf(t, fset, call.Args[1])
		return false
	})
	require.NotEmpty(t, routes)
	return routes
}

// routeOf reads the auth and the handler of a mux.Handle's handler.
func routeOf(t *testing.T, fset *token.FileSet, h ast.Expr) route {
	t.Helper()
	call, ok := h.(*ast.CallExpr)
	if !ok {
		return route{} // a handler value, such as o.riverUI
	}
	var r route
	switch fun := call.Fun.(type) {
	case *ast.Ident:
		switch {
		case fun.Name == "auth":
			sel, ok := call.Args[0].(*ast.SelectorExpr)
			require.True(t, ok && isIdent(sel.X, "ledger"), "%s: auth's scope must be a ledger.Scope… constant", fset.Position(call.Pos()))
			scope, ok := scopeNames[sel.Sel.Name]
			require.True(t, ok, "%s: unknown scope ledger.%s: add it to scopeNames", fset.Position(call.Pos()), sel.Sel.Name)
			r = routeOf(t, fset, call.Args[1])
			r.security = []string{"apiKey:" + string(scope)}
		case fun.Name == "requireAdminBasic":
			r = routeOf(t, fset, call.Args[len(call.Args)-1])
			r.security = []string{"apiKey:admin", "riverUIBasic:admin"}
		case fun.Name == "requireSameOrigin":
			r = routeOf(t, fset, call.Args[len(call.Args)-1])
		case fun.Name == "MetricsHandler":
			r.security = []string{"metricsToken:"}
		case strings.HasPrefix(fun.Name, "handle"):
			r.handler = strings.TrimPrefix(fun.Name, "handle")
		default:
			require.Failf(t, "unknown handler", "%s: %s: say in routeOf what it means for the document", fset.Position(call.Pos()), fun.Name)
		}
	case *ast.SelectorExpr:
		if isIdent(fun.X, "ingest") {
			// A handler of what strangers post, such as
			// ingest.UsageEventCreate.
			r.handler = fun.Sel.Name
			break
		}
		// A method value's handler, such as o.metrics.Handler().
	default:
		require.Failf(t, "unknown handler", "%s", fset.Position(call.Pos()))
	}
	slices.Sort(r.security)
	return r
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}
