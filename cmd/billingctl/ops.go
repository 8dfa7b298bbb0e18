package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
)

// redrive retries discarded charge_period and stripe_event jobs.
func redrive(ctx context.Context, client *river.Client[pgx.Tx], args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("redrive", flag.ContinueOnError)
	fs.SetOutput(stderr)
	customer := fs.String("customer", "", "only charge jobs of this customer")
	period := fs.String("period", "", "only charge jobs of this period")
	jobID := fs.Int64("job", 0, "only this job id")
	kind := fs.String("kind", "", "only this kind: charge_period or stripe_event (default both)")
	dryRun := fs.Bool("dry-run", false, "list what would be retried, retry nothing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p := jobs.RedriveParams{CustomerID: *customer, Period: *period, JobID: *jobID, DryRun: *dryRun}
	switch *kind {
	case "":
	case "charge_period", "stripe_event":
		p.Kinds = []string{*kind}
	default:
		return fmt.Errorf("--kind %q: want charge_period or stripe_event", *kind)
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
	key := getenv("STRIPE_API_KEY")
	if key == "" {
		return errors.New("STRIPE_API_KEY is required (and STRIPE_API_BASE for the simulator)")
	}
	timeout := 30 * time.Second
	if v := getenv("STRIPE_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("STRIPE_TIMEOUT: %w", err)
		}
		timeout = d
	}
	stripe := jobs.NewStripeAPI(jobs.StripeConfig{APIKey: key, BaseURL: getenv("STRIPE_API_BASE"), Timeout: timeout})
	c, err := l.ChargeGetByPeriod(ctx, *customer, *period)
	if err != nil {
		return err
	}
	before := c.Status
	res, err := jobs.ReconcileCharge(ctx, l, stripe, c)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "charge %d %s/%s: %s → %s (%s); PaymentIntents on Stripe: %s\n", res.Charge.ID, *customer, *period,
		before, res.Charge.Status, res.Action, strings.Join(append([]string{}, res.PaymentIntents...), ", "))
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
