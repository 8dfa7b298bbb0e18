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
		anchors := testtool.MarkdownSections(string(doc))
		for _, link := range links {
			require.Contains(t, anchors, link[1], "docs/operations.md has no section #%s", link[1])
		}
	})
}
