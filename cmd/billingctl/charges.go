package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
)

// Held charges and the kill switch: charges list/show/approve/cancel/resolve
// and charging pause/resume/status. Every action is recorded with the actor
// cli:<os user> (cliActor) and the required --reason; the ledger decides what
// is allowed, and its refusals are printed as they are (actionError).

// cliActor names the person running billingctl for the audit log:
// cli:<os user>, the user from os/user.Current, else $USER, else unknown.
func cliActor(getenv func(string) string) string {
	return cliActorFrom(user.Current, getenv)
}

// cliActorFrom is cliActor with the user lookup given.
func cliActorFrom(current func() (*user.User, error), getenv func(string) string) string {
	if u, err := current(); err == nil && u.Username != "" {
		return "cli:" + u.Username
	}
	if name := getenv("USER"); name != "" {
		return "cli:" + name
	}
	return "cli:unknown"
}

// parseInterspersed parses fs's flags from args wherever they stand, so both
// "approve 12 --reason R" and "approve --reason R 12" work, and returns the
// other arguments in order.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// chargeIDArg returns the one charge id among positional, for the usage line
// of cmd.
func chargeIDArg(positional []string, cmd string) (int64, error) {
	if len(positional) != 1 {
		return 0, fmt.Errorf("usage: billingctl %s", cmd)
	}
	id, err := strconv.ParseInt(positional[0], 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("%q is not a charge id (a whole number, see billingctl charges list)\nusage: billingctl %s", positional[0], cmd)
	}
	return id, nil
}

// actionFlags maps the ledger's field names to the flags that carry them.
var actionFlags = map[string]string{
	"reason":              "--reason",
	"keep_payment_intent": "--keep",
	"status":              "--status",
	"limit":               "--limit",
	"customer_id":         "--customer",
}

// actionError turns a ledger refusal into a plain message: a conflict's
// detail and code, a validation error by flag, an unknown charge by id.
// When the charge is held, the line that moves it on follows.
func actionError(ctx context.Context, l *ledger.Ledger, chargeID int64, err error) error {
	var (
		ce *ledger.ConflictError
		ve *ledger.ValidationError
	)
	switch {
	case errors.As(err, &ce):
		msg := fmt.Sprintf("%s (%s)", ce.Detail, ce.Code)
		if c, gerr := l.ChargeGet(ctx, chargeID); gerr == nil && c.Status == ledger.ChargeHeld && c.HeldReason != nil {
			msg += fmt.Sprintf("\nheld for %s; the way out: %s", *c.HeldReason, c.HeldReason.Exit(c.ID))
		}
		return errors.New(msg)
	case errors.As(err, &ve):
		return validationError(ve)
	case errors.Is(err, ledger.ErrNotFound) && chargeID != 0:
		return fmt.Errorf("charge %d not found (see billingctl charges list)", chargeID)
	}
	return err
}

// validationError names each invalid field by its flag.
func validationError(ve *ledger.ValidationError) error {
	parts := make([]string, 0, len(ve.Fields))
	for _, field := range slices.Sorted(maps.Keys(ve.Fields)) {
		name := actionFlags[field]
		if name == "" {
			name = field
		}
		parts = append(parts, name+": "+ve.Fields[field])
	}
	return errors.New(strings.Join(parts, "\n"))
}

// warnIfPaused tells the person that what they set in motion waits while
// charging is paused.
func warnIfPaused(ctx context.Context, l *ledger.Ledger, what string, stderr io.Writer) {
	st, err := l.ChargingGet(ctx)
	if err != nil || !st.Paused {
		return
	}
	fmt.Fprintf(stderr, "note: charging is paused (%s); %s waits until billingctl charging resume --reason \"…\"\n", chargingWho(st), what)
}

func chargeList(ctx context.Context, l *ledger.Ledger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("charges list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	status := fs.String("status", "", "only charges in this status: pending, processing, unknown, held, succeeded, failed, skipped, canceled")
	customer := fs.String("customer", "", "only this customer's charges")
	limit := fs.Int("limit", ledger.ChargeListLimitDefault, fmt.Sprintf("at most this many, newest first (1 to %d)", ledger.ChargeListLimitMax))
	after := fs.Int64("after", 0, "only charges older than this charge id (the next page)")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return errors.New("usage: billingctl charges list [--status S] [--customer C] [--limit N] [--after ID]")
	}
	if *limit < 1 {
		return fmt.Errorf("--limit: must be between 1 and %d", ledger.ChargeListLimitMax)
	}
	charges, more, err := l.ChargeList(ctx, ledger.ChargeListParams{Status: ledger.ChargeStatus(*status),
		CustomerID: *customer, AfterID: *after, Limit: *limit})
	if err != nil {
		return actionError(ctx, l, 0, err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCUSTOMER\tPERIOD\tSTATUS\tAMOUNT\tHELD FOR\tUPDATED")
	for _, c := range charges {
		held := "-"
		if c.Status == ledger.ChargeHeld && c.HeldReason != nil {
			held = string(*c.HeldReason)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.CustomerID, c.Period, c.Status, amount(c),
			held, c.UpdatedAt.UTC().Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(stderr, "more charges follow: add --after %d\n", charges[len(charges)-1].ID)
	}
	return nil
}

func chargeShow(ctx context.Context, l *ledger.Ledger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("charges show", flag.ContinueOnError)
	fs.SetOutput(stderr)
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	id, err := chargeIDArg(positional, "charges show ID")
	if err != nil {
		return err
	}
	c, err := l.ChargeGet(ctx, id)
	if err != nil {
		return actionError(ctx, l, id, err)
	}
	attempts, transitions, err := l.ChargeHistory(ctx, id)
	if err != nil {
		return err
	}
	actions, err := l.ChargeActions(ctx, id)
	if err != nil {
		return err
	}
	refunds, err := l.RefundListByCharge(ctx, id)
	if err != nil {
		return err
	}
	disputes, err := l.DisputeListByCharge(ctx, id)
	if err != nil {
		return err
	}
	lines, err := l.ChargeLines(ctx, id)
	if err != nil {
		return err
	}

	fmt.Fprintf(stdout, "charge %d  %s/%s  %s\n", c.ID, c.CustomerID, c.Period, c.Status)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	row := func(label, format string, args ...any) {
		fmt.Fprintf(tw, "  %s\t"+format+"\n", append([]any{label}, args...)...)
	}
	row("amount:", "%s (%d events)", amount(c), c.EventCount)
	if c.CarriedInCents > 0 {
		row("carried in:", "%d %s of it from earlier charges below Stripe's minimum", c.CarriedInCents, c.Currency)
	}
	if c.CarriedInto != nil {
		row("carried into:", "charge %d, which bills this amount", *c.CarriedInto)
	}
	row("stripe:", "customer %s, payment method %s, payment intent %s, charge %s", c.StripeCustomerID,
		orDash(c.StripePaymentMethodID), orDash(c.StripePaymentIntentID), orDash(c.StripeChargeID))
	row("key:", "tally_charge_key %s, generation %d", c.ChargeKey, c.KeyGeneration)
	if c.HeldReason != nil && c.Status == ledger.ChargeHeld {
		row("held for:", "%s since %s: %s", *c.HeldReason, formatTime(c.HeldAt), orDash(c.HeldDetail))
		row("way out:", "%s", c.HeldReason.Exit(c.ID))
	}
	if c.ApprovedAt != nil {
		row("approved:", "%s (its guards are waived)", formatTime(c.ApprovedAt))
	}
	if c.LookupRequired {
		row("look-up:", "its next call looks at Stripe first")
	}
	if c.FailureCode != nil || c.FailureMessage != nil {
		row("failure:", "%s: %s", orDash(c.FailureCode), orDash(c.FailureMessage))
	}
	if c.PastDueSince != nil {
		next := "none left"
		if c.NextRetryAt != nil {
			next = formatTime(c.NextRetryAt) + fmt.Sprintf(" (or now: billingctl charges retry %d)", c.ID)
		}
		row("dunning:", "declined first %s, %d retries made, next %s", formatTime(c.PastDueSince), c.DunningRetries, next)
	}
	if len(c.RetiredPaymentIntentIDs) > 0 {
		row("canceled:", "%s (by retries; they can never succeed)", strings.Join(c.RetiredPaymentIntentIDs, ", "))
	}
	if c.ResolvedBy != nil {
		row("resolved by:", "%s", *c.ResolvedBy)
	}
	if c.LeaseOwner != nil {
		row("lease:", "held by %s until %s", *c.LeaseOwner, formatTime(c.LeaseExpiresAt))
	}
	row("created:", "%s, updated %s", c.CreatedAt.UTC().Format(time.RFC3339), c.UpdatedAt.UTC().Format(time.RFC3339))
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(stdout, "\nlines (the amount is their sum): %d\n", len(lines))
	for _, li := range lines {
		fmt.Fprintf(stdout, "  #%d %s\n", li.Line, lineText(li, c.Currency))
	}

	fmt.Fprintf(stdout, "\nattempts (Stripe calls): %d\n", len(attempts))
	for _, a := range attempts {
		line := fmt.Sprintf("  #%d gen %d  %s", a.Attempt, a.KeyGeneration, a.StartedAt.UTC().Format(time.RFC3339))
		if a.FinishedAt == nil {
			line += "  unfinished"
		} else {
			line += "  " + orDash(a.Outcome)
		}
		if a.HTTPStatus != nil {
			line += fmt.Sprintf("  http %d", *a.HTTPStatus)
		}
		for _, s := range []*string{a.StripePaymentIntentID, a.StripeRequestID} {
			if s != nil {
				line += "  " + *s
			}
		}
		if a.ErrorCode != nil || a.ErrorMessage != nil {
			line += "  error " + orDash(a.ErrorCode) + ": " + oneLine(orDash(a.ErrorMessage))
		}
		if a.RiverJobID != nil {
			line += fmt.Sprintf("  (job %d)", *a.RiverJobID)
		}
		fmt.Fprintln(stdout, line)
	}

	fmt.Fprintf(stdout, "\ntransitions: %d\n", len(transitions))
	for _, t := range transitions {
		line := fmt.Sprintf("  %s  %s → %s  by %s", t.CreatedAt.UTC().Format(time.RFC3339), orDash(t.FromStatus), t.ToStatus, t.Actor)
		if t.Reason != nil {
			line += ": " + oneLine(*t.Reason)
		}
		fmt.Fprintln(stdout, line)
	}

	fmt.Fprintf(stdout, "\noperator actions: %d\n", len(actions))
	for _, a := range actions {
		line := fmt.Sprintf("  %s  %s  by %s", a.CreatedAt.UTC().Format(time.RFC3339), a.Action, a.Actor)
		if a.StatusBefore != nil && a.StatusAfter != nil {
			line += fmt.Sprintf("  (%s → %s)", *a.StatusBefore, *a.StatusAfter)
		}
		line += fmt.Sprintf(": %q", a.Reason)
		for _, k := range slices.Sorted(maps.Keys(a.Detail)) {
			line += fmt.Sprintf("  %s=%v", k, a.Detail[k])
		}
		fmt.Fprintln(stdout, line)
	}

	fmt.Fprintf(stdout, "\nrefunds: %d\n", len(refunds))
	for _, r := range refunds {
		line := fmt.Sprintf("  %s  %s  %s  %d %s  of %s", r.StripeCreatedAt.UTC().Format(time.RFC3339), r.StripeRefundID,
			cmp.Or(r.Status, "-"), r.AmountCents, r.Currency, orDash(r.StripePaymentIntentID))
		if r.Reason != nil {
			line += "  reason " + *r.Reason
		}
		if r.FailureReason != nil {
			line += "  failure " + *r.FailureReason
		}
		fmt.Fprintln(stdout, line)
	}

	fmt.Fprintf(stdout, "\ndisputes: %d\n", len(disputes))
	for _, d := range disputes {
		line := fmt.Sprintf("  %s  %s  %s  %d %s", d.StripeCreatedAt.UTC().Format(time.RFC3339), d.StripeDisputeID,
			cmp.Or(d.Status, "-"), d.AmountCents, d.Currency)
		if d.Reason != nil {
			line += "  reason " + *d.Reason
		}
		if d.EvidenceDueBy != nil {
			line += "  evidence due " + formatTime(d.EvidenceDueBy)
		}
		if d.FundsWithdrawnAt != nil {
			line += "  funds withdrawn " + formatTime(d.FundsWithdrawnAt)
		}
		if d.FundsReinstatedAt != nil {
			line += "  funds reinstated " + formatTime(d.FundsReinstatedAt)
		}
		fmt.Fprintln(stdout, line)
	}
	return nil
}

// chargeActionArgs parses "ID --reason R" (and the extra flags that add
// registers) for the usage line of cmd.
func chargeActionArgs(args []string, cmd string, stderr io.Writer, add func(fs *flag.FlagSet)) (int64, string, error) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	reason := fs.String("reason", "", "why, for the audit log (required, 1 to 1000 characters)")
	if add != nil {
		add(fs)
	}
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return 0, "", err
	}
	id, err := chargeIDArg(positional, cmd)
	return id, *reason, err
}

func chargeApprove(ctx context.Context, l *ledger.Ledger, actor string, args []string, stdout, stderr io.Writer) error {
	id, reason, err := chargeActionArgs(args, "charges approve ID --reason R", stderr, nil)
	if err != nil {
		return err
	}
	c, err := l.ChargeApprove(ctx, ledger.ChargeActionParams{ChargeID: id, Actor: actor, Reason: reason})
	if err != nil {
		return actionError(ctx, l, id, err)
	}
	fmt.Fprintf(stdout, "approved charge %d (%s/%s, %s): now %s; its guards are waived and its charge job runs now, looking at Stripe before it calls\n",
		c.ID, c.CustomerID, c.Period, amount(c), c.Status)
	warnIfPaused(ctx, l, "the charge job", stderr)
	return nil
}

func chargeRetry(ctx context.Context, l *ledger.Ledger, actor string, args []string, stdout, stderr io.Writer) error {
	id, reason, err := chargeActionArgs(args, "charges retry ID [--reason R]", stderr, nil)
	if err != nil {
		return err
	}
	c, err := l.ChargeRetryNow(ctx, ledger.ChargeActionParams{ChargeID: id, Actor: actor, Reason: reason})
	if err != nil {
		return actionError(ctx, l, id, err)
	}
	fmt.Fprintf(stdout, "retrying charge %d (%s/%s, %s) now: its charge job cancels the declined PaymentIntent and calls Stripe with the next key and the customer's current payment method (retry %d)\n",
		c.ID, c.CustomerID, c.Period, amount(c), c.DunningRetries+1)
	warnIfPaused(ctx, l, "the retry", stderr)
	return nil
}

func chargeCancel(ctx context.Context, l *ledger.Ledger, actor string, args []string, stdout, stderr io.Writer) error {
	id, reason, err := chargeActionArgs(args, "charges cancel ID --reason R", stderr, nil)
	if err != nil {
		return err
	}
	c, err := l.ChargeCancel(ctx, ledger.ChargeActionParams{ChargeID: id, Actor: actor, Reason: reason})
	if err != nil {
		return actionError(ctx, l, id, err)
	}
	if c.Status == ledger.ChargePastDue {
		fmt.Fprintf(stdout, "cancel of charge %d (%s/%s, %s) requested: its charge job cancels its PaymentIntents on Stripe, then the charge (follow it: billingctl charges show %d)\n",
			c.ID, c.CustomerID, c.Period, amount(c), c.ID)
		return nil
	}
	fmt.Fprintf(stdout, "canceled charge %d (%s/%s, %s): now %s; it will never be charged\n",
		c.ID, c.CustomerID, c.Period, amount(c), c.Status)
	return nil
}

func chargeResolve(ctx context.Context, l *ledger.Ledger, actor string, args []string, stdout, stderr io.Writer) error {
	var keep *string
	id, reason, err := chargeActionArgs(args, "charges resolve ID --keep PI --reason R", stderr, func(fs *flag.FlagSet) {
		keep = fs.String("keep", "", "the PaymentIntent to keep, pi_… (required); every other one carrying the charge's key is refunded")
	})
	if err != nil {
		return err
	}
	c, err := l.ChargeResolveRequest(ctx, ledger.ChargeResolveRequestParams{
		ChargeActionParams: ledger.ChargeActionParams{ChargeID: id, Actor: actor, Reason: reason},
		KeepPaymentIntent:  *keep,
	})
	if err != nil {
		return actionError(ctx, l, id, err)
	}
	fmt.Fprintf(stdout, "resolve of charge %d (%s/%s, %s) requested: keep %s; the resolve job refunds every other succeeded PaymentIntent carrying its key, then settles it as succeeded; until then it stays %s (follow it: billingctl charges show %d)\n",
		c.ID, c.CustomerID, c.Period, amount(c), *keep, c.Status, c.ID)
	warnIfPaused(ctx, l, "the resolve job", stderr)
	return nil
}

// chargingArgs parses "--reason R" for the usage line of cmd.
func chargingArgs(args []string, cmd string, stderr io.Writer) (string, error) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	reason := fs.String("reason", "", "why, for the audit log (required, 1 to 1000 characters)")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return "", err
	}
	if len(positional) > 0 {
		return "", fmt.Errorf("usage: billingctl %s", cmd)
	}
	return *reason, nil
}

func chargingPause(ctx context.Context, l *ledger.Ledger, actor string, args []string, stdout, stderr io.Writer) error {
	reason, err := chargingArgs(args, "charging pause --reason R", stderr)
	if err != nil {
		return err
	}
	st, err := l.ChargingPause(ctx, actor, reason)
	if err != nil {
		return actionError(ctx, l, 0, err)
	}
	fmt.Fprintf(stdout, "charging paused on every replica (%s): no charge or resolve job calls Stripe until billingctl charging resume --reason \"…\"\n", chargingWho(st))
	return nil
}

func chargingResume(ctx context.Context, l *ledger.Ledger, actor string, args []string, stdout, stderr io.Writer) error {
	reason, err := chargingArgs(args, "charging resume --reason R", stderr)
	if err != nil {
		return err
	}
	st, err := l.ChargingResume(ctx, actor, reason)
	if err != nil {
		return actionError(ctx, l, 0, err)
	}
	fmt.Fprintf(stdout, "charging resumed (%s)\n", chargingWho(st))
	return nil
}

func chargingStatus(ctx context.Context, l *ledger.Ledger, args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return errors.New("usage: billingctl charging status")
	}
	st, err := l.ChargingGet(ctx)
	if err != nil {
		return err
	}
	switch {
	case st.Paused:
		fmt.Fprintf(stdout, "charging is PAUSED (%s): no charge or resolve job calls Stripe\n", chargingWho(st))
	case st.By != "":
		fmt.Fprintf(stdout, "charging is running (resumed: %s)\n", chargingWho(st))
	case st.Discrepancy != "":
		fmt.Fprintln(stdout, "charging is running (resumed outside Tally)")
	default:
		fmt.Fprintln(stdout, "charging is running (never paused)")
	}
	if st.Discrepancy != "" {
		fmt.Fprintf(stdout, "WARNING: %s\n", st.Discrepancy)
	}
	return nil
}

// chargingWho says since when, by whom and why the kill switch is as it is.
func chargingWho(st *ledger.ChargingStatus) string {
	parts := []string{"since " + formatTime(st.Since)}
	if st.By != "" {
		parts = append(parts, "by "+st.By)
	}
	s := strings.Join(parts, " ")
	if st.Reason != "" {
		s += fmt.Sprintf(": %q", st.Reason)
	}
	return s
}

// amount is a charge's amount in minor units and its currency: 900 usd.
func amount(c *ledger.Charge) string { return fmt.Sprintf("%d %s", c.AmountCents, c.Currency) }

func orDash[T ~string](s *T) string {
	if s == nil {
		return "-"
	}
	return string(*s)
}

// lineText is one line of a charge as charges show prints it.
func lineText(li ledger.ChargeLine, currency string) string {
	switch u := li.Usage; {
	case li.Kind == ledger.ChargeLineCarried:
		return fmt.Sprintf("carried     %d %s from earlier charges", li.AmountCents, currency)
	case li.Kind == ledger.ChargeLineCredit:
		return fmt.Sprintf("credit      %d %s from grant %s", li.AmountCents, currency, li.GrantID)
	case u == nil:
		return fmt.Sprintf("pre-priced  %d events  %d %s", li.EventCount, li.AmountCents, currency)
	default:
		text := fmt.Sprintf("usage       %s  %s (%d events)  plan %s v%d %s", u.Metric, u.Rated.Quantity.Text('f'),
			li.EventCount, u.PlanID, u.PlanVersion, u.Rated.Model)
		for _, t := range u.Rated.Tiers {
			text += fmt.Sprintf("  [tier %d: %s × %s + %s]", t.Tier+1, t.Quantity.Text('f'), t.UnitAmount.Text('f'),
				t.FlatAmount.Text('f'))
		}
		if u.Rated.Model == pricing.ModelPackage {
			text += fmt.Sprintf("  [%s packages]", u.Rated.Packages.Text('f'))
		}
		if u.Rated.MinimumApplied {
			text += "  [minimum]"
		}
		return text + fmt.Sprintf("  %s → %d %s", li.ExactAmount.Text('f'), li.AmountCents, currency)
	}
}
