// Package tally_test tests the repository as a whole, as a reader meets it:
// the README's quick start run as written against the stack of make run
// (readme_test.go), and a refund and a dispute made in that stack's
// simulator found in the ledger (devstack_test.go).
package tally_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/tools/proc"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// The README's quick start as written (defaults of scripts/run-dev.sh); the
// test runs its own stack on other ports and swaps these for its own.
const (
	readmeHTTPAddr = "127.0.0.1:8080"
	readmeSimAddr  = "127.0.0.1:12111"
	readmeKeyFile  = ".tmp/dev-api-key"
	readmeDB       = "ensure-db.sh tally"
)

// TestReadmeQuickStart runs the shell blocks of README.md's "Quick start"
// against the stack `make run` starts (scripts/run-dev.sh, on free ports and
// a database of its own), and checks what the README says they show: the
// customer, its credit grant and the event echoed back, a replay answered
// 200 with the same event, the charge succeeded, less the credits, with a
// PaymentIntent of the simulator, and the same rows through psql. A README change that breaks them fails here.
func TestReadmeQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack")
	}
	ctx := context.Background()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	blocks := quickStartBlocks(t, string(readme))
	require.Len(t, blocks, 3, "Quick start: make run, the terminal-2 block, the psql block")
	require.Equal(t, "make run", strings.TrimSpace(blocks[0]), "the first command of the quick start")

	// The stack, as `make run` starts it, moved aside.
	stack := startDevStack(ctx, t)
	httpAddr, simAddr, dbName, keyFile := stack.HTTPAddr, stack.SimAddr, stack.DBName, stack.KeyFile
	banner, err := os.ReadFile(stack.LogPath)
	require.NoError(t, err)
	require.Contains(t, string(banner), "Dev API key")

	ours := strings.NewReplacer(readmeHTTPAddr, httpAddr, readmeSimAddr, simAddr,
		readmeKeyFile, keyFile, readmeDB, "ensure-db.sh "+dbName)
	run := func(script string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "bash", "-c", ours.Replace(script))
		cmd.Env = append(os.Environ(), "TALLY_ADMIN_DATABASE_URL="+testdb.AdminURL())
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s\n%s", script, out)
		return string(out)
	}

	// Terminal 2.
	out := run(blocks[1])
	require.Contains(t, out, `"customer_id":"acme"`)
	require.Contains(t, out, `"stripe_customer_id":"cus_acme"`)
	require.Contains(t, out, `"event_id":"evt-0001"`)
	require.Contains(t, out, `"event_id":"evt-0002"`)
	require.Contains(t, out, `"plan_id":"std","version":1`, "the plan put")
	require.Contains(t, out, `"grant_id":"welcome"`, "the credit grant")
	require.Contains(t, out, `"status":"closed"`, "the period close")
	prelude := blocks[1][:strings.Index(blocks[1], "api -X")] // the key and api()
	if !strings.Contains(out, `"projected_cents":1800`) {
		// The roll-ups lag ingest by about two runs; on a loaded machine
		// the block's sleep may be short: ask again, as a reader would.
		usage := regexp.MustCompile(`(?m)^api \S+/v1/customers/acme/usage$`).FindString(blocks[1])
		require.NotEmpty(t, usage, "the usage read of the quick start")
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
			if u := run(prelude + usage); strings.Contains(u, `"projected_cents":1800`) {
				out += u
				break
			}
		}
	}
	require.Contains(t, out, `"projected_cents":1800`, "the usage so far")
	require.Regexp(t, `"metric":"api_calls","event_count":1,"quantity":"1500","model":"graduated","exact_amount":"550","amount_cents":550`, out)
	if !regexp.MustCompile(`"status":"succeeded"`).MatchString(out) {
		// "Within a couple of seconds": on a loaded machine the block's
		// sleep may be short; ask again, as a reader would.
		last := blocks[1][strings.LastIndex(blocks[1], "api "):]
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(out, `"status":"succeeded"`) && time.Now().Before(deadline) {
			time.Sleep(time.Second)
			out = run(prelude + last)
		}
		t.Logf("the charge took longer than the README's sleep 2")
	}
	require.Contains(t, out, `"status":"succeeded"`)
	require.Regexp(t, `"stripe_payment_intent_id":"pi_[A-Za-z0-9]+"`, out)

	// The comment's promise: the same body again is 200 with the same event.
	event := regexp.MustCompile(`(?m)^api -X POST \S+/v1/usage-events \\\n\s+(-d '[^']*')`).FindStringSubmatch(blocks[1])
	require.NotNil(t, event, "the usage-event post of the quick start")
	replay := run(fmt.Sprintf(`curl -sS -o /dev/null -w '%%{http_code}' -H "Authorization: Bearer $(cat %s)" -H 'Content-Type: application/json' %s http://%s/v1/usage-events`,
		readmeKeyFile, event[1], readmeHTTPAddr))
	require.Equal(t, "200", replay, "an exact replay")

	// The ledger in plain SQL.
	out = run(blocks[2])
	require.Regexp(t, `acme\s+\|\s+evt-0001\s+\|`, out)
	require.Regexp(t, `acme\s+\|\s+\S+\s+\|\s+succeeded\s+\|\s+1500\s+\|\s+pi_`, out, "1800 less 300 of credits")
	require.Regexp(t, `\|\s+1\s+\|\s+usage\s+\|\s+api_calls\s+\|\s+1500\s+\|\s+550\s+\|\s+550\b`, out, "the rated line")
	require.Regexp(t, `\|\s+2\s+\|\s+pre_priced\s+\|\s+\|\s+\|\s+1250\s+\|\s+1250\b`, out)
	require.Regexp(t, `\|\s+3\s+\|\s+credit\s+\|\s+\|\s+\|\s+-300\s+\|\s+-300\b`, out, "the credit line")

	// The simulator's own record, from the line after the blocks.
	sim := regexp.MustCompile("`(curl -s http://127\\.0\\.0\\.1:12111/_sim/payment_intents)`").FindStringSubmatch(string(readme))
	require.NotNil(t, sim, "the simulator's curl line of the quick start")
	require.Regexp(t, `"amount":1500`, run(sim[1]))
}

// quickStartBlocks returns the fenced blocks of README's "## Quick start"
// section, in order.
func quickStartBlocks(t *testing.T, readme string) []string {
	t.Helper()
	start := strings.Index(readme, "\n## Quick start\n")
	require.GreaterOrEqual(t, start, 0, "README.md has no Quick start section")
	section := readme[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// freeAddr returns a loopback address with a port free at the time of asking.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := proc.FreePort()
	require.NoError(t, err)
	return fmt.Sprintf("127.0.0.1:%d", port)
}
