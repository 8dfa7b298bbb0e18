package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripeapi"
)

// redrive retries discarded charge_period, stripe_event and top_up jobs.
func redrive(ctx context.Context, client *river.Client[pgx.Tx], args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("redrive", flag.ContinueOnError)
	fs.SetOutput(stderr)
	customer := fs.String("customer", "", "only charge and top-up jobs of this customer")
	period := fs.String("period", "", "only charge jobs of this period")
	jobID := fs.Int64("job", 0, "only this job id")
	kind := fs.String("kind", "", "only this kind: charge_period, stripe_event or top_up (default all three)")
	dryRun := fs.Bool("dry-run", false, "list what would be retried, retry nothing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p := jobs.RedriveParams{CustomerID: *customer, Period: *period, JobID: *jobID, DryRun: *dryRun}
	switch *kind {
	case "":
	case "charge_period", "stripe_event", "top_up":
		p.Kinds = []string{*kind}
	default:
		return fmt.Errorf("--kind %q: want charge_period, stripe_event or top_up", *kind)
	}
	items, err := jobs.Redrive(ctx, client, p)
	verb := "retried"
	if *dryRun {
		verb = "would retry"
	}
	for _, it := range items {
		fmt.Fprintf(stdout, "%s job %d %s %s after %d attempts; last error: %s\n", verb, it.JobID, it.Kind, it.Args, it.Attempts, oneLine(it.Error))
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%s %d discarded jobs\n", verb, len(items))
	return nil
}

// reconcile brings one charge in line with Stripe now.
func reconcile(ctx context.Context, l *ledger.Ledger, getenv func(string) string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	customer := fs.String("customer", "", "the charge's customer (required)")
	period := fs.String("period", "", "the charge's period (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *customer == "" || *period == "" {
		return errors.New("--customer and --period are required")
	}
	stripe, err := stripeFromEnv(getenv)
	if err != nil {
		return err
	}
	c, err := l.ChargeGetByPeriod(ctx, *customer, *period)
	if err != nil {
		return err
	}
	before := c.Status
	res, err := jobs.ReconcileCharge(ctx, l, stripe, c)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "charge %d %s/%s: %s → %s (%s); on Stripe: %s\n", res.Charge.ID, *customer, *period,
		before, res.Charge.Status, res.Action, paymentIntentsSummary(res.PaymentIntents))
	return nil
}

// recoverAfterLoss is billingctl recover: after a restore or a lossy
// failover, mark every charge that may still call Stripe for a look-up first,
// and reconcile every charge not settled in Stripe-confirmed terms.
func recoverAfterLoss(ctx context.Context, l *ledger.Ledger, getenv func(string) string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("recover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	reason := fs.String("reason", "", "what was lost, for the audit log (required unless --dry-run), such as \"restored the 03:00 backup\"")
	dryRun := fs.Bool("dry-run", false, "look at Stripe and report; mark and change nothing")
	sinceFlag := fs.String("since", "", "about when the record was lost (RFC 3339, such as 2026-12-03T03:00:00Z): Tally's PaymentIntents created since then whose charge the ledger lost are adopted; default: an hour before the oldest open period's start or the newest charge change, whichever is earlier")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *reason == "" && !*dryRun {
		return errors.New("--reason is required: say what was lost, such as --reason \"restored the 03:00 backup\"")
	}
	var since time.Time
	if *sinceFlag != "" {
		var err error
		if since, err = time.Parse(time.RFC3339, *sinceFlag); err != nil {
			return fmt.Errorf("--since %q is not a time such as 2026-12-03T03:00:00Z", *sinceFlag)
		}
	}
	stripe, err := stripeFromEnv(getenv)
	if err != nil {
		return err
	}
	items, err := jobs.Recover(ctx, l, stripe, jobs.RecoverParams{Actor: cliActor(getenv), Reason: *reason, DryRun: *dryRun, Since: since})
	counts := map[string]int{}
	marked, failed := 0, 0
	for _, it := range items {
		c := it.Charge
		if it.Lost {
			if it.Err != nil {
				failed++
				fmt.Fprintf(stdout, "lost charge %s/%s: ERROR %s; on Stripe: %s\n", c.CustomerID, c.Period, oneLine(it.Err.Error()),
					paymentIntentsSummary(it.PaymentIntents))
				continue
			}
			counts[it.Action]++
			alert := ""
			if c.Status == ledger.ChargeHeld && c.HeldReason != nil && c.HeldDetail != nil {
				alert = "; ALERT held: " + string(*c.HeldReason) + ": " + oneLine(*c.HeldDetail)
			}
			fmt.Fprintf(stdout, "lost charge %s/%s: the ledger had lost it → %s (%s); on Stripe: %s%s\n", c.CustomerID, c.Period,
				cmp.Or(string(c.Status), "closed and created"), it.Action, paymentIntentsSummary(it.PaymentIntents), alert)
			continue
		}
		mark := ""
		if it.Marked {
			mark = "; marked: its next call looks at Stripe first"
			marked++
		}
		if it.Err != nil {
			failed++
			fmt.Fprintf(stdout, "charge %d %s/%s: %s: ERROR %s%s\n", c.ID, c.CustomerID, c.Period, it.Before, oneLine(it.Err.Error()), mark)
			continue
		}
		counts[it.Action]++
		if c.Status == ledger.ChargeHeld && c.HeldReason != nil && c.HeldDetail != nil {
			mark = "; ALERT held: " + string(*c.HeldReason) + ": " + oneLine(*c.HeldDetail) + mark
		}
		fmt.Fprintf(stdout, "charge %d %s/%s: %s → %s (%s); on Stripe: %s%s\n", c.ID, c.CustomerID, c.Period,
			it.Before, c.Status, it.Action, paymentIntentsSummary(it.PaymentIntents), mark)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "looked at %d charges on Stripe; marked %d for a look-up before their next call; %s\n",
		len(items), marked, countsSummary(counts))
	if failed > 0 {
		return fmt.Errorf("%d charges could not be reconciled (see ERROR lines); run recover again", failed)
	}
	return nil
}

// stripeFromEnv returns the Stripe client that STRIPE_API_KEY,
// STRIPE_API_BASE and STRIPE_TIMEOUT describe.
func stripeFromEnv(getenv func(string) string) (*stripeapi.Client, error) {
	key := getenv("STRIPE_API_KEY")
	if key == "" {
		return nil, errors.New("STRIPE_API_KEY is required (and STRIPE_API_BASE for the simulator)")
	}
	timeout := stripeapi.TimeoutDefault
	if v := getenv("STRIPE_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("STRIPE_TIMEOUT: %w", err)
		}
		timeout = d
	}
	return stripeapi.New(stripeapi.Config{APIKey: key, BaseURL: getenv("STRIPE_API_BASE"), Timeout: timeout}), nil
}

func paymentIntentsSummary(pis []*stripe.PaymentIntent) string {
	if len(pis) == 0 {
		return "nothing"
	}
	parts := make([]string, len(pis))
	for i, pi := range pis {
		parts[i] = jobs.PaymentIntentSummary(pi)
	}
	return strings.Join(parts, ", ")
}

func countsSummary(counts map[string]int) string {
	keys := slices.Sorted(maps.Keys(counts))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, counts[k])
	}
	if len(parts) == 0 {
		return "nothing to do"
	}
	return strings.Join(parts, ", ")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
