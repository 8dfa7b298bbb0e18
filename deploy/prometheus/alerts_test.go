// Package prometheus_test checks Tally's Prometheus alerting rules with
// promtool, and that every runbook they point to exists.
package prometheus_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/tools/testtool"
)

func TestAlertRules(t *testing.T) {
	promtool := testtool.Bin(t, "PROMTOOL_BIN", "promtool")

	t.Run("Check", func(t *testing.T) {
		out, err := exec.Command(promtool, "check", "rules", "alerts.yml").CombinedOutput()
		require.NoError(t, err, "promtool check rules:\n%s", out)
	})

	t.Run("UnitTests", func(t *testing.T) {
		out, err := exec.Command(promtool, "test", "rules", "alerts_test.yml").CombinedOutput()
		require.NoError(t, err, "promtool test rules:\n%s", out)
	})

	t.Run("RunbooksExist", func(t *testing.T) {
		rules, err := os.ReadFile("alerts.yml")
		require.NoError(t, err)
		runbook := regexp.MustCompile(`runbook: docs/operations\.md#(\S+)`)
		links := runbook.FindAllStringSubmatch(string(rules), -1)
		require.Len(t, links, strings.Count(string(rules), "- alert:"), "every alert has a runbook")

		doc, err := os.ReadFile("../../docs/operations.md")
		require.NoError(t, err)
		anchors := map[string]bool{}
		for _, line := range strings.Split(string(doc), "\n") {
			if heading, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
				anchors[githubAnchor(heading)] = true
			}
		}
		for _, link := range links {
			require.True(t, anchors[link[1]], "docs/operations.md has no section #%s", link[1])
		}
	})
}

// githubAnchor is the anchor GitHub gives a markdown heading: lower case,
// spaces to hyphens, punctuation other than - and _ dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
