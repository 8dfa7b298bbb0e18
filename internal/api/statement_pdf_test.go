package api_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/tools/testtool"
)

// A statement's HTML page prints: headless Chromium prints it to PDF, and
// the PDF's text (pdftotext) is testdata/statement.txt. Set
// TALLY_UPDATE_SNAPSHOTS=1 to write the snapshot again after a deliberate
// change of the page.
func TestChargeStatementPDF(t *testing.T) {
	t.Parallel()
	chromium := testtool.Bin(t, "CHROMIUM_BIN", "chromium")
	pdftotext := testtool.Bin(t, "PDFTOTEXT_BIN", "pdftotext")
	ctx, b := setup(t, setupOpts{})
	rec := b.do(http.MethodPut, "/v1/plans/std",
		`{"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1"}]}}}`)
	require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
	rec = b.do(http.MethodPut, "/v1/customers/acme", `{"stripe_customer_id":"cus_acme","currency":"usd","plan_id":"std"}`)
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	for i, q := range []string{"1200", "300.5"} {
		_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "q" + strconv.Itoa(i),
			Metric: "api_calls", Quantity: q})
		require.NoError(t, err)
	}
	_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "p", AmountCents: 1999})
	require.NoError(t, err)
	rec = b.do(http.MethodPost, "/v1/customers/acme/credit-grants",
		`{"grant_id":"welcome","amount_cents":500,"currency":"usd","category":"promotional"}`)
	require.Equal(t, http.StatusCreated, rec.Code, "body: %s", rec.Body)
	cc, err := b.Ledger.PeriodCloseClaim(ctx, ledger.PeriodCloseClaimParams{
		Close: ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"},
		Claim: ledger.ChargeClaimParams{Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1}, PaymentMethodOf: "cus_acme"})
	require.NoError(t, err)
	claim, err := b.Ledger.ChargeLookupNone(ctx, cc.Claim, "job:1/1")
	require.NoError(t, err)
	c, err := b.Ledger.ChargeRecordOutcome(ctx, claim, ledger.Outcome{Class: ledger.OutcomeSucceeded, StripePaymentIntentID: "pi_statement"}, "job:1/1", nil)
	require.NoError(t, err)

	req := b.newRequest(http.MethodGet, "/v1/charges/"+strconv.FormatInt(c.ID, 10)+"/statement", "")
	req.Header.Set("Accept", "text/html")
	rec = b.serve(req)
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	dir := t.TempDir()
	page, pdf := filepath.Join(dir, "statement.html"), filepath.Join(dir, "statement.pdf")
	require.NoError(t, os.WriteFile(page, rec.Body.Bytes(), 0o600))

	run := func(name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		var stderr strings.Builder
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "%s %v: %s", name, args, stderr.String())
		return string(out)
	}
	run(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
		"--disable-dev-shm-usage", "--user-data-dir="+filepath.Join(dir, "profile"), "--no-pdf-header-footer",
		"--print-to-pdf="+pdf, "file://"+page)
	text := run(pdftotext, "-layout", pdf, "-")
	// One line per line of text, spaces between columns folded: the layout's
	// widths are the font's, not the statement's.
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(regexp.MustCompile(`\s+`).ReplaceAllString(l, " ")); l != "" {
			lines = append(lines, l)
		}
	}
	got := strings.Join(lines, "\n") + "\n"
	snapshot := filepath.Join("testdata", "statement.txt")
	if os.Getenv("TALLY_UPDATE_SNAPSHOTS") != "" {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(snapshot, []byte(got), 0o644))
	}
	want, err := os.ReadFile(snapshot)
	require.NoError(t, err, "no snapshot yet: run with TALLY_UPDATE_SNAPSHOTS=1")
	require.Equal(t, string(want), got)
}
