package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tally-billing/tally/internal/ledger"
)

// Outbound webhooks: webhooks list/create/delete/rotate-secret/redeliver, as
// the API's /v1/webhook-endpoints does, and the way out of a delivery that
// ran out of attempts (ALERT webhook_delivery_failed).

func init() {
	actionFlags["url"] = "--url"
	actionFlags["events"] = "--events"
	actionFlags["description"] = "--description"
	actionFlags["selection"] = "--notification, --endpoint, --since or --until"
}

func webhookList(ctx context.Context, l *ledger.Ledger, args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return errors.New("usage: billingctl webhooks list")
	}
	list, err := l.WebhookEndpointList(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tURL\tEVENTS\tSTATE\tDESCRIPTION\tCREATED")
	for _, e := range list {
		state := "enabled"
		if e.DisabledAt != nil {
			state = "DISABLED since " + e.DisabledAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.URL, strings.Join(e.Events, ","), state, e.Description,
			e.CreatedAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// webhookCreate prints the new endpoint's secret alone on stdout (for a
// pipe), the rest on stderr.
func webhookCreate(ctx context.Context, l *ledger.Ledger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("webhooks create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "", "where to post, https://…")
	events := fs.String("events", "", "notification types, comma-separated, or * for all: "+strings.Join(ledger.NotificationTypes, ","))
	description := fs.String("description", "", "what the endpoint is for")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return errors.New("usage: billingctl webhooks create --url URL --events TYPE[,TYPE…] [--description D]")
	}
	var list []string
	for _, e := range strings.Split(*events, ",") {
		if e = strings.TrimSpace(e); e != "" {
			list = append(list, e)
		}
	}
	e, err := l.WebhookEndpointCreate(ctx, ledger.WebhookEndpointCreateParams{URL: *url, Events: list, Description: *description})
	if err != nil {
		return actionError(ctx, l, 0, err)
	}
	fmt.Fprintf(stderr, "webhook endpoint %d created for %s; its signing secret (shown once) follows on stdout\n", e.ID, strings.Join(e.Events, ","))
	fmt.Fprintln(stdout, e.Secret)
	return nil
}

// endpointIDArg returns the one endpoint id among args.
func endpointIDArg(positional []string, cmd string) (int64, error) {
	if len(positional) != 1 {
		return 0, fmt.Errorf("usage: billingctl %s", cmd)
	}
	id, err := strconv.ParseInt(positional[0], 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("%q is not a webhook endpoint id (a whole number, see billingctl webhooks list)\nusage: billingctl %s", positional[0], cmd)
	}
	return id, nil
}

func webhookDelete(ctx context.Context, l *ledger.Ledger, args []string, stderr io.Writer) error {
	id, err := endpointIDArg(args, "webhooks delete ID")
	if err != nil {
		return err
	}
	if err := l.WebhookEndpointDelete(ctx, id); err != nil {
		if errors.Is(err, ledger.ErrNotFound) {
			return fmt.Errorf("webhook endpoint %d not found (see billingctl webhooks list)", id)
		}
		return err
	}
	fmt.Fprintf(stderr, "webhook endpoint %d deleted; its pending deliveries are canceled\n", id)
	return nil
}

func webhookRotate(ctx context.Context, l *ledger.Ledger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("webhooks rotate-secret", flag.ContinueOnError)
	fs.SetOutput(stderr)
	grace := fs.Duration("grace", ledger.WebhookSecretGraceDefault, "how long the old secret keeps signing beside the new one")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	id, err := endpointIDArg(positional, "webhooks rotate-secret ID [--grace 24h]")
	if err != nil {
		return err
	}
	e, err := l.WebhookEndpointRotateSecret(ctx, id, *grace)
	if err != nil {
		var ve *ledger.ValidationError
		if errors.As(err, &ve) {
			return fmt.Errorf("--grace: must be between 0s and %s (a week)", ledger.WebhookSecretGraceMax)
		}
		if errors.Is(err, ledger.ErrNotFound) {
			return fmt.Errorf("webhook endpoint %d not found (see billingctl webhooks list)", id)
		}
		return err
	}
	fmt.Fprintf(stderr, "webhook endpoint %d has a new secret (on stdout); the old one signs beside it until %s\n",
		e.ID, e.PreviousSecretUntil.UTC().Format(time.RFC3339))
	fmt.Fprintln(stdout, e.Secret)
	return nil
}

func webhookRedeliver(ctx context.Context, l *ledger.Ledger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("webhooks redeliver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	notification := fs.String("notification", "", "only this notification (ntf_…)")
	endpoint := fs.Int64("endpoint", 0, "only deliveries to this endpoint")
	since := fs.String("since", "", "only notifications written at or after this time (RFC 3339)")
	until := fs.String("until", "", "only notifications written before this time (RFC 3339)")
	dryRun := fs.Bool("dry-run", false, "count them, send nothing")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return errors.New("usage: billingctl webhooks redeliver [--notification ntf_…] [--endpoint ID] [--since T] [--until T] [--dry-run]")
	}
	p := ledger.WebhookRedeliverParams{NotificationID: *notification, EndpointID: *endpoint, DryRun: *dryRun}
	for _, f := range []struct {
		name, value string
		into        **time.Time
	}{{"--since", *since, &p.Since}, {"--until", *until, &p.Until}} {
		if f.value == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, f.value)
		if err != nil {
			return fmt.Errorf("%s: %q is not an RFC 3339 time such as 2026-12-01T00:00:00Z", f.name, f.value)
		}
		*f.into = &t
	}
	n, err := l.WebhookRedeliver(ctx, p)
	if err != nil {
		return actionError(ctx, l, 0, err)
	}
	if *dryRun {
		fmt.Fprintf(stdout, "%d deliveries would be sent again\n", n)
		return nil
	}
	fmt.Fprintf(stdout, "%d deliveries sent again (same notification ids: receivers drop what they have)\n", n)
	return nil
}

func webhookEnable(ctx context.Context, l *ledger.Ledger, args []string, stderr io.Writer) error {
	id, err := endpointIDArg(args, "webhooks enable ID")
	if err != nil {
		return err
	}
	if _, err := l.WebhookEndpointEnable(ctx, id); err != nil {
		if errors.Is(err, ledger.ErrNotFound) {
			return fmt.Errorf("webhook endpoint %d not found (see billingctl webhooks list)", id)
		}
		return err
	}
	fmt.Fprintf(stderr, "webhook endpoint %d enabled; send what it missed with billingctl webhooks redeliver --endpoint %d --since <when it began failing>\n", id, id)
	return nil
}
