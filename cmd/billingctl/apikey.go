package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tally-billing/tally/internal/ledger"
)

func apiKeyCreate(ctx context.Context, l *ledger.Ledger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("apikey create", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "", "a name for the key (required)")
	scopesFlag := fs.String("scopes", "", "comma-separated scopes (required): usage:write, customers:write, billing:read, admin")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" {
		return errors.New("--name is required")
	}
	scopes, err := ledger.ParseScopes(*scopesFlag)
	if err != nil {
		return fmt.Errorf("--scopes: %w", err)
	}
	secret, key, err := l.APIKeyCreate(ctx, *name, scopes)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "created API key %q (%s) with scopes %s; its secret is printed once, below on stdout\n",
		key.Name, key.Prefix, joinScopes(key.Scopes))
	fmt.Fprintln(stdout, secret)
	return nil
}

func apiKeyList(ctx context.Context, l *ledger.Ledger, stdout io.Writer) error {
	keys, err := l.APIKeyList(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PREFIX\tNAME\tSCOPES\tCREATED\tLAST USED\tREVOKED")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.Prefix, k.Name, joinScopes(k.Scopes),
			k.CreatedAt.Format(time.RFC3339), formatTime(k.LastUsedAt), formatTime(k.RevokedAt))
	}
	return tw.Flush()
}

func apiKeyRevoke(ctx context.Context, l *ledger.Ledger, args []string, stderr io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: billingctl apikey revoke PREFIX|NAME")
	}
	key, err := l.APIKeyRevoke(ctx, args[0])
	if errors.Is(err, ledger.ErrNotFound) {
		return fmt.Errorf("no live API key has prefix or name %q (see billingctl apikey list)", args[0])
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "revoked API key %q (%s)\n", key.Name, key.Prefix)
	return nil
}

func joinScopes(scopes []ledger.Scope) string {
	s := make([]string, len(scopes))
	for i, sc := range scopes {
		s[i] = string(sc)
	}
	return strings.Join(s, ",")
}

func formatTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}
