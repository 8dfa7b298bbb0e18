package ledger_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/tools/testtool"
)

const ledgerPath = "github.com/tally-billing/tally/internal/ledger"

// The alert keys: every one is declared in alert.go with a runbook section
// of docs/operations.md that names it, every key the docs, the deploy
// files and the code's comments name is declared, and every ALERT line takes
// its key from a declared constant.
func TestAlert(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	declared := alertsDeclared(t)

	t.Run("KeysNamedAreDeclared", func(t *testing.T) {
		t.Parallel()
		named := []*regexp.Regexp{
			regexp.MustCompile(`\balert=~?"?([a-z0-9_]+)`),       // alert=charge_held, a label matcher alert="…"
			regexp.MustCompile(`"alert":\s*"([a-z0-9_]+)"`),      // a JSON log line
			regexp.MustCompile(`(?m)^#+ alert: ([a-z0-9_]+)$`),   // a runbook heading
			regexp.MustCompile(`\bALERT ([a-z0-9]+_[a-z0-9_]+)`), // ALERT stripe_event_stuck
		}
		values := map[string]bool{}
		for _, v := range declared {
			values[v.value] = true
		}
		found := 0
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path != root && strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				return nil
			}
			switch filepath.Ext(path) {
			case ".md", ".go", ".yml", ".yaml", ".json":
			default:
				return nil
			}
			text, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			for _, re := range named {
				for _, m := range re.FindAllStringSubmatch(string(text), -1) {
					require.True(t, values[m[1]], "%s names alert %q, which internal/ledger/alert.go does not declare", rel, m[1])
					found++
				}
			}
			return nil
		})
		require.NoError(t, err)
		require.NotZero(t, found, "no alert key named anywhere: the patterns no longer match the docs")
	})

	t.Run("RaiseSitesUseConstants", func(t *testing.T) {
		t.Parallel()
		alertsRaised(t, root, declared)
	})

	t.Run("RunbooksNameTheirAlert", func(t *testing.T) {
		t.Parallel()
		doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
		require.NoError(t, err)
		sections := testtool.MarkdownSections(string(doc))
		runbook := regexp.MustCompile(`Runbook: docs/operations\.md#([a-z0-9_-]+)`)
		for name, a := range declared {
			links := runbook.FindAllStringSubmatch(a.doc, -1)
			require.Len(t, links, 1, "the comment of %s names its runbook once: Runbook: docs/operations.md#…", name)
			section, ok := sections[links[0][1]]
			require.True(t, ok, "%s: docs/operations.md has no section #%s", name, links[0][1])
			require.True(t, strings.Contains(section, "alert="+a.value) || strings.Contains(section, `"alert":"`+a.value+`"`),
				"%s: section #%s of docs/operations.md does not name alert=%s", name, links[0][1], a.value)
		}
	})
}

// alertDeclared is one Alert constant of alert.go: its key and its comment.
type alertDeclared struct {
	value string
	doc   string
}

// alertsDeclared reads the Alert constants of alert.go, by name.
func alertsDeclared(t *testing.T) map[string]alertDeclared {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "alert.go", nil, parser.ParseComments)
	require.NoError(t, err)
	declared := map[string]alertDeclared{}
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			vs := spec.(*ast.ValueSpec)
			if typ, ok := vs.Type.(*ast.Ident); !ok || typ.Name != "Alert" {
				continue
			}
			require.Len(t, vs.Names, 1)
			require.Len(t, vs.Values, 1)
			lit, ok := vs.Values[0].(*ast.BasicLit)
			require.True(t, ok, "%s is a string literal", vs.Names[0].Name)
			value, err := strconv.Unquote(lit.Value)
			require.NoError(t, err)
			declared[vs.Names[0].Name] = alertDeclared{value: value, doc: vs.Doc.Text()}
		}
	}
	require.NotEmpty(t, declared)
	return declared
}

// goPackage is what go list says of one package.
type goPackage struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
	Module     *struct{ Main bool }
}

// goList runs go list -json args in root. It lists, builds nothing.
func goList(t *testing.T, root string, args ...string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Dir,GoFiles,CgoFiles,Module"}, args...)...)
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list %v: %s", args, stderr.String())
	var pkgs []goPackage
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p goPackage
		require.NoError(t, dec.Decode(&p))
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// alertsRaised checks every ALERT line's key in the module's code. The
// attribute key "alert" is written only by Alert.Attr (alert.go), so a line
// carries an Alert. An Alert, outside alert.go, is one of its constants or
// the zero Alert (no alert): never a string literal given the type (an
// untyped constant converts silently), so every key raised is declared.
// Every constant is raised somewhere.
//
// The module's packages are type-checked from source, dependencies first.
// What they import from outside the module (the standard library included)
// is not loaded: the type checker stands in an empty package for it and
// goes on, which leaves every constant of type Alert typed, as none is
// made of anything from outside. So nothing is compiled here (export data
// would mean building every dependency without -race, minutes on a cold
// cache), and the last check, that every constant is raised somewhere,
// fails if the stand-ins ever hide a raise.
func alertsRaised(t *testing.T, root string, declared map[string]alertDeclared) {
	t.Helper()
	var own []goPackage
	for _, p := range goList(t, root, "-deps", "./...") {
		if p.Module != nil && p.Module.Main {
			require.Empty(t, p.CgoFiles, "%s: cgo is not type-checked here", p.ImportPath)
			own = append(own, p)
		}
	}
	fset := token.NewFileSet()
	checked := map[string]*types.Package{}
	imp := importerFunc(func(path string) (*types.Package, error) {
		if pkg, ok := checked[path]; ok {
			return pkg, nil
		}
		return nil, errNotLoaded
	})

	raised := map[string]bool{}
	for _, p := range own {
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			files = append(files, f)
		}
		info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}}
		conf := types.Config{
			Importer: imp,
			// Errors from the packages not loaded; the compiler has
			// checked this code already.
			Error: func(error) {},
		}
		pkg, _ := conf.Check(p.ImportPath, fset, files, info)
		require.NotNil(t, pkg, "%s: not type-checked", p.ImportPath)
		checked[p.ImportPath] = pkg

		inAlertGo := func(pos token.Pos) bool {
			return p.ImportPath == ledgerPath && filepath.Base(fset.Position(pos).Filename) == "alert.go"
		}
		for _, f := range files {
			if inAlertGo(f.Pos()) {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && lit.Value == `"alert"` {
					t.Errorf(`%s: the key "alert" outside alert.go: use ledger.Alert's Attr`, fset.Position(lit.Pos()))
				}
				return true
			})
		}
		for expr, tv := range info.Types {
			if tv.Value == nil || !isAlert(tv.Type) || inAlertGo(expr.Pos()) {
				continue
			}
			var id *ast.Ident
			switch e := expr.(type) {
			case *ast.Ident:
				id = e
			case *ast.SelectorExpr:
				id = e.Sel
			case *ast.ParenExpr:
				continue // its inside is checked
			}
			if c, ok := info.Uses[id].(*types.Const); ok && c.Pkg().Path() == ledgerPath {
				if _, ok := declared[c.Name()]; ok {
					raised[c.Name()] = true
					continue
				}
			}
			if constant.StringVal(tv.Value) == "" {
				continue // the zero Alert: none
			}
			t.Errorf("%s: an Alert that is not a constant of alert.go: %s", fset.Position(expr.Pos()), tv.Value)
		}
	}
	require.Contains(t, checked, ledgerPath)
	for name := range declared {
		require.True(t, raised[name], "%s is raised nowhere", name)
	}
}

// isAlert reports whether typ is ledger.Alert.
func isAlert(typ types.Type) bool {
	named, ok := typ.(*types.Named)
	return ok && named.Obj().Name() == "Alert" && named.Obj().Pkg() != nil && named.Obj().Pkg().Path() == ledgerPath
}

// errNotLoaded is the importer's answer for a package from outside the
// module: go/types then stands in an empty package for it.
var errNotLoaded = errors.New("not loaded: outside the module")

// importerFunc is a types.Importer.
type importerFunc func(path string) (*types.Package, error)

// Import imports path.
func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }
