package apispec_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/oapi-codegen/oapi-codegen/v2/pkg/codegen"
	"github.com/oapi-codegen/oapi-codegen/v2/pkg/util"
	"github.com/stretchr/testify/require"

	// The packages a client generated from the document imports beyond the
	// standard library (go.yaml.in/yaml/v3 for GET /openapi.yaml's YAML):
	// imported here so that go.mod keeps requiring them, and the client
	// TestClient generates builds from the module cache.
	_ "github.com/oapi-codegen/runtime"
	_ "go.yaml.in/yaml/v3"
)

// clientPackage is the package name TestClient generates the client in.
const clientPackage = "tallyclient"

// TestClient generates a Go client from openapi.yaml with oapi-codegen
// (v2.8.2, as go.mod pins it), as README.md's command does (types and
// client), and requires that it builds and works. The document goes in as it
// is: oapi-codegen v2.8.2 reads OpenAPI 3.1 (type: [T, "null"] and oneOf
// [$ref, null] become *T), so no down-conversion to 3.0 is needed. The client
// and testdata/clientcall_test.go go in a package of their own under
// testdata/ (inside the module, so it may import internal packages; in
// testdata, so ./... never lists it), and `go test` runs it: that builds (and
// vets) the client, and makes real calls with it to an API server on a test
// database. The package is removed afterwards.
func TestClient(t *testing.T) {
	t.Parallel()

	cfg := codegen.Configuration{
		PackageName: clientPackage,
		Generate:    codegen.GenerateOptions{Models: true, Client: true},
	}.UpdateDefaults()
	require.NoError(t, cfg.Validate())
	spec, err := util.LoadSwagger("openapi.yaml")
	require.NoError(t, err)
	code, err := codegen.Generate(spec, cfg)
	require.NoError(t, err)

	dir, err := os.MkdirTemp("testdata", clientPackage+"-")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(dir)) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "client.gen.go"), []byte(code), 0o644))
	call, err := os.ReadFile(filepath.Join("testdata", "clientcall_test.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "clientcall_test.go"), call, 0o644))

	// The same -race as this test's, so the build reuses what this test's
	// build left in the cache.
	args := []string{"test", "-count=1"}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "-race" && s.Value == "true" {
				args = append(args, "-race")
			}
		}
	}
	cmd := exec.CommandContext(t.Context(), "go", append(args, "./"+filepath.ToSlash(dir))...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the client generated from openapi.yaml does not build or work:\n%s", out)
}
