package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPlans(t *testing.T) {
	t.Parallel()
	ctx, b := chargesSetup(t)

	stdout, _, err := b.billingctl(ctx, "plans", "list")
	require.NoError(t, err)
	require.Equal(t, "PLAN  CURRENCY  VERSION  METRICS  SINCE  BY\n", stdout, "no plans: the header alone")

	b.Plan(t, "std", `{"currency":"usd","prices":{"api_calls":{"model":"per_unit","unit_amount":"0.5"}}}`)
	b.Clock.Advance(time.Hour)
	b.Plan(t, "std", `{"currency":"usd","prices":{"api_calls":{"model":"per_unit","unit_amount":"0.4"},"storage_gb":{"model":"package","package_size":"100","unit_amount":"250"}}}`)
	b.Plan(t, "empty", `{"currency":"eur","prices":{}}`)

	stdout, _, err = b.billingctl(ctx, "plans", "list")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 3, stdout)
	require.Regexp(t, `^empty\s+eur\s+1\s+-\s+2026-11-14T11:30:00Z\s+test$`, lines[1])
	require.Regexp(t, `^std\s+usd\s+2\s+api_calls,storage_gb\s+2026-11-14T11:30:00Z\s+test$`, lines[2])

	stdout, stderr, err := b.billingctl(ctx, "plans", "list", "--limit", "1")
	require.NoError(t, err)
	require.Contains(t, stdout, "empty")
	require.NotContains(t, stdout, "std")
	require.Equal(t, "more plans follow: add --after empty\n", stderr)
	stdout, _, err = b.billingctl(ctx, "plans", "list", "--after", "empty")
	require.NoError(t, err)
	require.Contains(t, stdout, "std")
	require.NotContains(t, stdout, "empty")
	_, _, err = b.billingctl(ctx, "plans", "list", "--limit", "501")
	require.ErrorContains(t, err, "--limit: must be between 1 and 500")

	stdout, _, err = b.billingctl(ctx, "plans", "show", "std")
	require.NoError(t, err)
	require.Equal(t, `plan std  usd  version 2 of 2
(a customer's period is priced with the version in force when it opened)

version 2  2026-11-14T11:30:00Z  by test
  api_calls   {"model":"per_unit","unit_amount":"0.4"}
  storage_gb  {"model":"package","package_size":"100","unit_amount":"250"}

version 1  2026-11-14T10:30:00Z  by test
  api_calls  {"model":"per_unit","unit_amount":"0.5"}
`, stdout)
	stdout, _, err = b.billingctl(ctx, "plans", "show", "empty")
	require.NoError(t, err)
	require.Contains(t, stdout, "version 1  2026-11-14T11:30:00Z  by test\n  no prices\n")

	_, _, err = b.billingctl(ctx, "plans", "show", "ghost")
	require.ErrorContains(t, err, `plan "ghost" not found (see billingctl plans list)`)
	_, _, err = b.billingctl(ctx, "plans", "show")
	require.ErrorContains(t, err, "usage: billingctl plans show PLAN")
	_, _, err = b.billingctl(ctx, "plans")
	require.ErrorContains(t, err, "billingctl plans list")
}
