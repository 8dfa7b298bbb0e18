package apispec_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/tools/testtool"

	// The packages a client generated from the document imports beyond the
	// standard library (go.yaml.in/yaml/v3 for GET /openapi.yaml's YAML):
	// imported here so that go.mod keeps requiring them, and the client
	// TestClient generates builds from the module cache.
	_ "github.com/oapi-codegen/runtime"
	_ "go.yaml.in/yaml/v3"
)

// clientPackage is the package name TestClient generates the client in.
const clientPackage = "tallyclient"

// oapiCodegenVersion is the oapi-codegen README.md's command runs, and
// scripts/ensure-tools.sh installs.
const oapiCodegenVersion = "v2.8.2"

// TestClient generates a Go client from openapi.yaml with oapi-codegen, run
// as README.md's command runs it (types and client), and requires that it
// builds and works. oapi-codegen is a tool, not a dependency of the module
// (scripts/ensure-tools.sh installs it; OAPI_CODEGEN_BIN names it), so the
// module does not carry its OpenAPI library. The document goes in as it
// is: oapi-codegen v2.8.2 reads OpenAPI 3.1 (type: [T, "null"] and oneOf
// [$ref, null] become *T), so no down-conversion to 3.0 is needed. The
// client and testdata/clientcall_test.go go in a package of their own under
// testdata/ (inside the module, so it may import internal packages; in
// testdata, so ./... never lists it), and `go test` runs it: that builds
// (and vets) the client, and makes real calls with it to an API server on a
// test database. The package is removed afterwards.
func TestClient(t *testing.T) {
	t.Parallel()

	bin := testtool.Bin(t, "OAPI_CODEGEN_BIN", "oapi-codegen")
	version, err := exec.CommandContext(t.Context(), bin, "-version").Output()
	require.NoError(t, err)
	require.Equal(t, oapiCodegenVersion, lastLine(version), "%s -version: scripts/ensure-tools.sh installs %s", bin, oapiCodegenVersion)
	code, err := exec.CommandContext(t.Context(), bin, "-generate", "types,client", "-package", clientPackage, "openapi.yaml").Output()
	require.NoError(t, err, "oapi-codegen: %s", stderr(err))

	dir, err := os.MkdirTemp("testdata", clientPackage+"-")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, os.RemoveAll(dir)) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "client.gen.go"), code, 0o644))
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

// lastLine returns the last non-empty line of out, trimmed.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// stderr returns what a command that failed with err wrote on stderr.
func stderr(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}
