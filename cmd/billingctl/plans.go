package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tally-billing/tally/internal/ledger"
)

// Plans: plans list/show, the price books PUT /v1/plans/{plan_id} keeps,
// read from the ledger as the API's GET /v1/plans does.

func init() {
	actionFlags["starting_after"] = "--after"
}

func planList(ctx context.Context, l *ledger.Ledger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plans list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	limit := fs.Int("limit", ledger.PlanListLimitDefault, fmt.Sprintf("at most this many, by plan id (1 to %d)", ledger.PlanListLimitMax))
	after := fs.String("after", "", "only plans after this plan id (the next page)")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return errors.New("usage: billingctl plans list [--limit N] [--after PLAN]")
	}
	if *limit < 1 {
		return fmt.Errorf("--limit: must be between 1 and %d", ledger.PlanListLimitMax)
	}
	plans, more, err := l.PlanList(ctx, ledger.PlanListParams{StartingAfter: *after, Limit: *limit})
	if err != nil {
		return actionError(ctx, l, 0, err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PLAN\tCURRENCY\tVERSION\tMETRICS\tSINCE\tBY")
	for _, v := range plans {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", v.PlanID, v.Plan.Currency, v.Version, orNone(metricsOf(v)),
			v.CreatedAt.UTC().Format(time.RFC3339), v.CreatedBy)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(stderr, "more plans follow: add --after %s\n", plans[len(plans)-1].PlanID)
	}
	return nil
}

func planShow(ctx context.Context, l *ledger.Ledger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plans show", flag.ContinueOnError)
	fs.SetOutput(stderr)
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return errors.New("usage: billingctl plans show PLAN")
	}
	versions, err := l.PlanGet(ctx, positional[0])
	if errors.Is(err, ledger.ErrNotFound) {
		return fmt.Errorf("plan %q not found (see billingctl plans list)", positional[0])
	}
	if err != nil {
		return err
	}
	latest := versions[len(versions)-1]
	fmt.Fprintf(stdout, "plan %s  %s  version %d of %d\n", latest.PlanID, latest.Plan.Currency, latest.Version, len(versions))
	fmt.Fprintln(stdout, "(a customer's period is priced with the version in force when it opened)")
	for i := len(versions) - 1; i >= 0; i-- {
		v := versions[i]
		fmt.Fprintf(stdout, "\nversion %d  %s  by %s\n", v.Version, v.CreatedAt.UTC().Format(time.RFC3339), v.CreatedBy)
		var book struct {
			Prices map[string]json.RawMessage `json:"prices"`
		}
		if err := json.Unmarshal(v.PriceBook, &book); err != nil {
			return fmt.Errorf("error reading version %d of plan %s: %w", v.Version, v.PlanID, err)
		}
		if len(book.Prices) == 0 {
			fmt.Fprintln(stdout, "  no prices")
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, metric := range slices.Sorted(maps.Keys(book.Prices)) {
			fmt.Fprintf(tw, "  %s\t%s\n", metric, book.Prices[metric])
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// metricsOf lists the metrics v prices, in byte order.
func metricsOf(v *ledger.PlanVersion) string {
	return strings.Join(slices.Sorted(maps.Keys(v.Plan.Prices)), ",")
}

// orNone is s, or "-" when empty.
func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
