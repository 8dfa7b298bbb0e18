// Package grafana_test checks Tally's Grafana dashboard: valid JSON, every
// query valid PromQL (promtool), every series one that Tally exports.
package grafana_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/testtool"
)

type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("tally.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(raw, &d))
	require.NotEmpty(t, d.Panels)

	// The names Tally exports: the Name of every metric in internal/metrics.
	var source strings.Builder
	files, err := filepath.Glob("../../internal/metrics/*.go")
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		source.Write(b)
	}
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`"(tally_[a-z_]+)"`).FindAllStringSubmatch(source.String(), -1) {
		exported[m[1]] = true
	}
	require.NotEmpty(t, exported)

	// Every query as a recording rule, for promtool to parse.
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	series := regexp.MustCompile(`\b(tally_[a-z_]+)`)
	for i, p := range d.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for j, target := range p.Targets {
			for _, m := range series.FindAllStringSubmatch(target.Expr, -1) {
				name := m[1]
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
						name = base
					}
				}
				require.True(t, exported[name], "panel %q queries %s, which Tally does not export", p.Title, m[1])
			}
			expr := strings.ReplaceAll(target.Expr, "$job", ".*")
			fmt.Fprintf(&rules, "      - record: dashboard:panel%d_%d\n        expr: %q\n", i, j, expr)
		}
	}
	path := filepath.Join(t.TempDir(), "dashboard_rules.yml")
	require.NoError(t, os.WriteFile(path, []byte(rules.String()), 0o600))
	out, err := exec.Command(testtool.Bin(t, "PROMTOOL_BIN", "promtool"), "check", "rules", path).CombinedOutput()
	require.NoError(t, err, "promtool check rules on the dashboard's queries:\n%s", out)
}
