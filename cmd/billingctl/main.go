// Command billingctl is the operator's tool for Tally:
//
//	billingctl apikey create --name NAME --scopes a,b   print a new key's secret (alone, on stdout)
//	billingctl apikey list                              list keys (never their secrets)
//	billingctl apikey revoke PREFIX|NAME                revoke a key
//	billingctl redrive [--customer C] [--period P] [--job ID] [--kind K] [--dry-run]
//	                                                    retry discarded charge and webhook jobs
//	billingctl reconcile --customer C --period P        settle one charge from Stripe now
//	billingctl recover --reason R [--since T] [--dry-run]
//	                                                    after a restore or a lossy failover: adopt the
//	                                                    charges the ledger lost and Stripe has, mark every
//	                                                    charge that may still call Stripe for a look-up
//	                                                    first, reconcile every unconfirmed charge, report
//	billingctl charges list [--status S] [--customer C] [--limit N] [--after ID]
//	                                                    list charges, newest first
//	billingctl charges show ID                          a charge, its Stripe attempts, status transitions
//	                                                    and operator actions
//	billingctl charges approve ID --reason R            a held charge: charge it anyway (guards waived)
//	billingctl charges cancel ID --reason R             a held or pending charge no money moved for:
//	                                                    never charge it
//	billingctl charges resolve ID --keep PI --reason R  a double charge: keep PI, refund the others (a job)
//	billingctl charges retry ID [--reason R]            a past_due charge: retry it now (after a new card)
//	billingctl charging pause|resume --reason R         the kill switch: stop or restart charging on
//	                                                    every replica
//	billingctl charging status                          whether charging is paused, since when, by whom, why
//	billingctl plans list [--limit N] [--after PLAN]     plans by id, each at its latest version
//	billingctl plans show PLAN                          a plan's versions, newest first, with their prices
//	billingctl webhooks list                            the webhook endpoints (never their secrets)
//	billingctl webhooks create --url U --events T,… [--description D]
//	                                                    register an endpoint; print its secret on stdout
//	billingctl webhooks delete ID                       stop sending to an endpoint
//	billingctl webhooks enable ID                       send to an endpoint disabled for failing again
//	billingctl webhooks rotate-secret ID [--grace 24h]  a new secret; the old one signs beside it for --grace
//	billingctl webhooks redeliver [--notification N] [--endpoint ID] [--since T] [--until T] [--dry-run]
//	                                                    send delivered or failed deliveries again
//
// Approve, cancel, resolve, pause and resume are recorded in the audit log
// (billing.operator_actions) with the actor cli:<os user> and the reason;
// the ledger's refusals (a charge that is not held, whose money may have
// moved, or that a worker is charging right now) are printed as they are,
// with a non-zero exit. docs/operations.md says what each held reason means.
//
// The database comes from DATABASE_URL; webhooks create follows the
// server's TALLY_WEBHOOKS_ALLOW_CIDRS.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/postgres"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "billingctl: %v\n", err)
		os.Exit(1)
	}
}

const usage = `usage:
  billingctl apikey create --name NAME --scopes SCOPE[,SCOPE…]
  billingctl apikey list
  billingctl apikey revoke PREFIX|NAME
  billingctl redrive [--customer C] [--period P] [--job ID] [--kind charge_period|stripe_event] [--dry-run]
  billingctl reconcile --customer C --period P   (needs STRIPE_API_KEY, STRIPE_API_BASE)
  billingctl recover --reason "restored the 03:00 backup" [--since T] [--dry-run]   (needs STRIPE_API_KEY)
  billingctl charges list [--status S] [--customer C] [--limit N] [--after ID]
  billingctl charges show ID
  billingctl charges approve ID --reason R
  billingctl charges cancel ID --reason R
  billingctl charges resolve ID --keep pi_… --reason R
  billingctl charges retry ID [--reason R]
  billingctl charging pause --reason R
  billingctl charging resume --reason R
  billingctl charging status
  billingctl plans list [--limit N] [--after PLAN]
  billingctl plans show PLAN
  billingctl webhooks list
  billingctl webhooks create --url https://… --events charge.failed,period.closed [--description D]
  billingctl webhooks delete ID
  billingctl webhooks enable ID
  billingctl webhooks rotate-secret ID [--grace 24h]
  billingctl webhooks redeliver [--notification ntf_…] [--endpoint ID] [--since T] [--until T] [--dry-run]
scopes: usage:write, customers:write, billing:read, admin
statuses: pending, processing, unknown, held, succeeded, failed, skipped, canceled, carried_forward, past_due, uncollectible
database: DATABASE_URL
settings: the server's TALLY_* settings (TALLY_DUNNING_SCHEDULE, TALLY_NAMESPACE, TALLY_PERIOD, TALLY_WEBHOOKS_ALLOW_CIDRS,
          …): give billingctl the server's environment, so a charge it settles moves exactly as the server would
          move it, and webhooks create follows the server's rule of where webhooks may go`

// run dispatches a command. Anything meant for a pipe (a secret) goes to
// stdout; everything for the person goes to stderr.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if len(args) < 1 || (slices.Contains([]string{"apikey", "charges", "charging", "plans", "webhooks"}, args[0]) && len(args) < 2) {
		return errors.New(usage)
	}
	url := getenv("DATABASE_URL")
	if url == "" {
		return errors.New("DATABASE_URL is required, such as postgres://user@127.0.0.1:5432/tally")
	}
	pool, err := postgres.Connect(ctx, url, "tally-billingctl", 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	client, err := jobs.NewInsertClient(pool, logger)
	if err != nil {
		return err
	}
	// The server's settings: a charge billingctl settles (reconcile,
	// recover) moves exactly as the server would move it, and endpoints are
	// created under the server's rule of where webhooks may go.
	lc, err := ledger.ConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("invalid configuration (billingctl reads the server's TALLY_* settings):\n%w", err)
	}
	lc.Scheduler, lc.Logger = jobs.Scheduler{Client: client}, logger
	l, err := ledger.New(pool, lc)
	if err != nil {
		return err
	}

	switch args[0] {
	case "redrive":
		return redrive(ctx, client, args[1:], stdout, stderr)
	case "reconcile":
		return reconcile(ctx, l, getenv, args[1:], stdout, stderr)
	case "recover":
		return recoverAfterLoss(ctx, l, getenv, args[1:], stdout, stderr)
	case "apikey", "charges", "charging", "plans", "webhooks":
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
	actor := cliActor(getenv)
	switch args[0] + " " + args[1] {
	case "apikey create":
		return apiKeyCreate(ctx, l, args[2:], stdout, stderr)
	case "apikey list":
		return apiKeyList(ctx, l, stdout)
	case "apikey revoke":
		return apiKeyRevoke(ctx, l, args[2:], stderr)
	case "charges list":
		return chargeList(ctx, l, args[2:], stdout, stderr)
	case "charges show":
		return chargeShow(ctx, l, args[2:], stdout, stderr)
	case "charges approve":
		return chargeApprove(ctx, l, actor, args[2:], stdout, stderr)
	case "charges cancel":
		return chargeCancel(ctx, l, actor, args[2:], stdout, stderr)
	case "charges resolve":
		return chargeResolve(ctx, l, actor, args[2:], stdout, stderr)
	case "charges retry":
		return chargeRetry(ctx, l, actor, args[2:], stdout, stderr)
	case "charging pause":
		return chargingPause(ctx, l, actor, args[2:], stdout, stderr)
	case "charging resume":
		return chargingResume(ctx, l, actor, args[2:], stdout, stderr)
	case "charging status":
		return chargingStatus(ctx, l, args[2:], stdout)
	case "plans list":
		return planList(ctx, l, args[2:], stdout, stderr)
	case "plans show":
		return planShow(ctx, l, args[2:], stdout, stderr)
	case "webhooks list":
		return webhookList(ctx, l, args[2:], stdout)
	case "webhooks create":
		return webhookCreate(ctx, l, args[2:], stdout, stderr)
	case "webhooks delete":
		return webhookDelete(ctx, l, args[2:], stderr)
	case "webhooks enable":
		return webhookEnable(ctx, l, args[2:], stderr)
	case "webhooks rotate-secret":
		return webhookRotate(ctx, l, args[2:], stdout, stderr)
	case "webhooks redeliver":
		return webhookRedeliver(ctx, l, args[2:], stdout, stderr)
	}
	return fmt.Errorf("unknown command %q\n%s", args[0]+" "+args[1], usage)
}
