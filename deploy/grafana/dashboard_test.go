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

	"github.com/tally-billing/tally/internal/tools/testtool"
)

type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Type    string `json:"type"`
		GridPos struct {
			X, Y, W, H int
		} `json:"gridPos"`
		Targets []struct {
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
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
	source := metricsSource(t)
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`"(tally_[a-z_]+)"`).FindAllStringSubmatch(source, -1) {
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

	// No two panels overlap on Grafana's 24-column grid.
	for i, a := range d.Panels {
		for _, b := range d.Panels[i+1:] {
			apart := a.GridPos.X+a.GridPos.W <= b.GridPos.X || b.GridPos.X+b.GridPos.W <= a.GridPos.X ||
				a.GridPos.Y+a.GridPos.H <= b.GridPos.Y || b.GridPos.Y+b.GridPos.H <= a.GridPos.Y
			require.True(t, apart, "panels %q and %q overlap", a.Title, b.Title)
		}
		require.LessOrEqual(t, a.GridPos.X+a.GridPos.W, 24, "panel %q is wider than the grid", a.Title)
	}

	// Charges by outcome over time: a time series of the charge transition
	// counter's increase by its "to" label, the status a charge reached,
	// which internal/metrics really declares on that counter.
	require.Regexp(t, `Name:\s+"tally_charge_transitions_total",[^}]*\},\s*\[\]string\{"from", "to"\}`, source,
		"internal/metrics counts charge transitions by from and to")
	outcomes := regexp.MustCompile(`^sum by \(to\) \((increase|rate)\(tally_charge_transitions_total(\{[^}]*\})?\[[0-9]+[smh]\]\)\)$`)
	found := 0
	for _, p := range d.Panels {
		for _, target := range p.Targets {
			if outcomes.MatchString(target.Expr) {
				found++
				require.Equal(t, "timeseries", p.Type, "panel %q plots charges by outcome over time", p.Title)
				require.Equal(t, "{{to}}", target.LegendFormat, "panel %q names each series by its outcome", p.Title)
			}
		}
	}
	require.Equal(t, 1, found, "one panel plots charges by outcome (sum by (to) of the increase of tally_charge_transitions_total)")
}

// metricsSource returns the Go source of internal/metrics, where every
// series Tally exports is declared.
func metricsSource(t *testing.T) string {
	t.Helper()
	var source strings.Builder
	files, err := filepath.Glob("../../internal/metrics/*.go")
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		source.Write(b)
	}
	return source.String()
}
