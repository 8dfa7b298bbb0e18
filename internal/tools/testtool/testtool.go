// Package testtool holds what tests of several packages share: it finds the
// external tools they run (promtool, stripe-mock: installed by
// scripts/ensure-tools.sh, which make test runs) and reads the sections of
// the markdown documents they check links against (MarkdownSections).
package testtool

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Bin returns the path of tool name: $envVar when set, else name on PATH,
// else $(go env GOPATH)/bin/name. When it is missing the test fails in CI
// (CI set) and is skipped elsewhere, with how to install it.
func Bin(t testing.TB, envVar, name string) string {
	t.Helper()
	bin := os.Getenv(envVar)
	if bin == "" {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
		} else if gopath, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			first, _, _ := strings.Cut(strings.TrimSpace(string(gopath)), string(os.PathListSeparator))
			bin = filepath.Join(first, "bin", name)
		}
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found (%q): make test installs it with scripts/ensure-tools.sh", name, bin)
		}
		t.Skipf("%s not found (%q); run make test, which installs it", name, bin)
	}
	return bin
}
