package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/pricing"
	"github.com/tally-billing/tally/internal/tools/ledgertest"
)

// chargesBundle is a ledger on a fresh database (with a charge scheduler, so
// periods close and charges hold) and billingctl on the same database.
type chargesBundle struct {
	*ledgertest.Bundle
	env func(string) string
}

func chargesSetup(t *testing.T) (context.Context, *chargesBundle) {
	t.Helper()
	return chargesSetupWith(t, ledger.Config{})
}

// chargesSetupWith is chargesSetup with the ledger configured by config.
func chargesSetupWith(t *testing.T, config ledger.Config) (context.Context, *chargesBundle) {
	t.Helper()
	lb := ledgertest.New(t, config)
	return t.Context(), &chargesBundle{Bundle: lb, env: func(k string) string {
		if k == "DATABASE_URL" {
			return lb.URL
		}
		return ""
	}}
}

// billingctl runs the command with args and returns its stdout and stderr.
func (b *chargesBundle) billingctl(ctx context.Context, args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, b.env, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// closed creates customer id with one event of amount and closes its
// November charge as the charge job would: pending, the guards not yet run.
func (b *chargesBundle) closed(ctx context.Context, t *testing.T, id string, amount int64) *ledger.Charge {
	t.Helper()
	b.Customer(t, id)
	_, err := b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: id, EventID: "e1", AmountCents: amount})
	require.NoError(t, err)
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: id, Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	return c
}

// capHeld returns customer id's charge of 500, held over_customer_cap.
func (b *chargesBundle) capHeld(ctx context.Context, t *testing.T, id string) *ledger.Charge {
	t.Helper()
	c := b.closed(ctx, t, id, 500)
	limit := int64(100)
	_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: id, StripeCustomerID: "cus_" + id, Currency: "usd", MaxChargeCents: &limit})
	require.NoError(t, err)
	cl, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
	require.NoError(t, err)
	require.Nil(t, cl)
	return b.status(ctx, t, c.ID, ledger.ChargeHeld)
}

// doubleCharged returns customer id's charge, held by the reconciler for a
// double charge.
func (b *chargesBundle) doubleCharged(ctx context.Context, t *testing.T, id string) *ledger.Charge {
	t.Helper()
	c := b.closed(ctx, t, id, 500)
	_, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "reconciler",
		Outcome: ledger.Outcome{Class: ledger.OutcomeHeld, HeldReason: ledger.HeldDoubleCharge, ErrorMessage: "pi_A, pi_B"}})
	require.NoError(t, err)
	return b.status(ctx, t, c.ID, ledger.ChargeHeld)
}

// status requires the stored charge id to be in status, and returns it.
func (b *chargesBundle) status(ctx context.Context, t *testing.T, id int64, status ledger.ChargeStatus) *ledger.Charge {
	t.Helper()
	c, err := b.Ledger.ChargeGet(ctx, id)
	require.NoError(t, err)
	require.Equal(t, status, c.Status)
	return c
}

func (b *chargesBundle) actions(ctx context.Context, t *testing.T, id int64) []*ledger.OperatorAction {
	t.Helper()
	actions, err := b.Ledger.ChargeActions(ctx, id)
	require.NoError(t, err)
	return actions
}

func id(c *ledger.Charge) string { return strconv.FormatInt(c.ID, 10) }

func TestCharges(t *testing.T) {
	t.Parallel()

	t.Run("ApproveHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.capHeld(ctx, t, "acme")
		stdout, stderr, err := b.billingctl(ctx, "charges", "approve", id(c), "--reason", "agreed with the customer")
		require.NoError(t, err, stderr)
		require.Contains(t, stdout, fmt.Sprintf("approved charge %d (acme/2026-11, 500 usd): now pending", c.ID))
		got := b.status(ctx, t, c.ID, ledger.ChargePending)
		require.NotNil(t, got.ApprovedAt)

		actions := b.actions(ctx, t, c.ID)
		require.Len(t, actions, 1)
		require.Equal(t, ledger.ActionApprove, actions[0].Action)
		require.Equal(t, cliActor(b.env), actions[0].Actor)
		require.True(t, strings.HasPrefix(actions[0].Actor, "cli:"))
		require.Equal(t, "agreed with the customer", actions[0].Reason)
	})

	t.Run("RetryPastDue", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetupWith(t, ledger.Config{DunningSchedule: []time.Duration{time.Hour}})
		c := b.closed(ctx, t, "acme", 500)
		_, _, err := b.billingctl(ctx, "charges", "retry", id(c))
		require.EqualError(t, err, fmt.Sprintf("charge %d is pending; only a past_due charge (declined, with retries left) can be retried (charge_not_past_due)", c.ID))

		_, err = b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "webhook:evt_1",
			Outcome: ledger.Outcome{Class: ledger.OutcomeFailed, StripePaymentIntentID: "pi_declined", ErrorCode: "card_declined"}})
		require.NoError(t, err)
		stdout, stderr, err := b.billingctl(ctx, "charges", "show", id(c))
		require.NoError(t, err, stderr)
		require.Regexp(t, `dunning:\s+declined first .*, 0 retries made, next .* \(or now: billingctl charges retry \d+\)`, stdout)

		stdout, stderr, err = b.billingctl(ctx, "charges", "retry", id(c))
		require.NoError(t, err, stderr)
		require.Contains(t, stdout, fmt.Sprintf("retrying charge %d (acme/2026-11, 500 usd) now", c.ID))
		got := b.status(ctx, t, c.ID, ledger.ChargePastDue)
		require.False(t, got.NextRetryAt.After(time.Now()), "due now (billingctl's ledger runs on the real clock)")
		actions := b.actions(ctx, t, c.ID)
		require.Len(t, actions, 1)
		require.Equal(t, ledger.ActionRetry, actions[0].Action)
		require.Equal(t, ledger.ChargeRetryReasonDefault, actions[0].Reason)
	})

	t.Run("ApproveRefusesADoubleCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.doubleCharged(ctx, t, "acme")
		stdout, _, err := b.billingctl(ctx, "charges", "approve", id(c), "--reason", "looks fine")
		require.Error(t, err)
		require.Empty(t, stdout)
		require.Contains(t, err.Error(), "(charge_not_held)")
		require.Contains(t, err.Error(), fmt.Sprintf("billingctl charges resolve %d --keep pi_", c.ID), "the way out is shown")
		require.False(t, strings.HasPrefix(err.Error(), "error in"), "the ledger's message, plainly: %s", err)
		require.Empty(t, b.actions(ctx, t, c.ID))
	})

	t.Run("ApproveRefusesAPendingCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.closed(ctx, t, "acme", 500)
		_, _, err := b.billingctl(ctx, "charges", "approve", id(c), "--reason", "x")
		require.EqualError(t, err, fmt.Sprintf("charge %d is pending; only a held charge can be approved (charge_not_held)", c.ID))
	})

	t.Run("ApproveWhenPausedSaysSo", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.capHeld(ctx, t, "acme")
		_, err := b.Ledger.ChargingPause(ctx, "operator:ops/tly_1", "incident 42")
		require.NoError(t, err)
		_, stderr, err := b.billingctl(ctx, "charges", "approve", id(c), "--reason", "ok")
		require.NoError(t, err, stderr)
		require.Contains(t, stderr, "charging is paused")
		require.Contains(t, stderr, "the charge job waits")
	})

	t.Run("ApproveWithFlagsFirst", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.capHeld(ctx, t, "acme")
		_, stderr, err := b.billingctl(ctx, "charges", "approve", "--reason", "ok", id(c))
		require.NoError(t, err, stderr)
		b.status(ctx, t, c.ID, ledger.ChargePending)
	})

	t.Run("BadID", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		for _, args := range [][]string{
			{"charges", "approve", "abc", "--reason", "x"},
			{"charges", "approve", "--reason", "x"},
			{"charges", "approve", "1", "2", "--reason", "x"},
			{"charges", "show"},
		} {
			_, _, err := b.billingctl(ctx, args...)
			require.ErrorContains(t, err, "usage: billingctl charges", "%v", args)
		}
	})

	t.Run("CancelHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.capHeld(ctx, t, "acme")
		stdout, stderr, err := b.billingctl(ctx, "charges", "cancel", id(c), "--reason", "the customer disputes the usage")
		require.NoError(t, err, stderr)
		require.Contains(t, stdout, fmt.Sprintf("canceled charge %d", c.ID))
		b.status(ctx, t, c.ID, ledger.ChargeCanceled)
		require.Equal(t, ledger.ActionCancel, b.actions(ctx, t, c.ID)[0].Action)
	})

	t.Run("CancelRefusedWhenMoneyMayHaveMoved", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.doubleCharged(ctx, t, "acme")
		_, _, err := b.billingctl(ctx, "charges", "cancel", id(c), "--reason", "x")
		require.ErrorContains(t, err, "money may have moved")
		require.ErrorContains(t, err, "(charge_outcome_unknown)")
		b.status(ctx, t, c.ID, ledger.ChargeHeld)
	})

	t.Run("List", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		pending := b.closed(ctx, t, "alpha", 300)
		held := b.capHeld(ctx, t, "beta")

		rows := func(stdout string) [][]string {
			lines := strings.Split(strings.TrimSpace(stdout), "\n")
			require.Equal(t, []string{"ID", "CUSTOMER", "PERIOD", "STATUS", "AMOUNT", "HELD", "FOR", "UPDATED"}, strings.Fields(lines[0]))
			var out [][]string
			for _, l := range lines[1:] {
				out = append(out, strings.Fields(l)[:7])
			}
			return out
		}
		stdout, stderr, err := b.billingctl(ctx, "charges", "list")
		require.NoError(t, err, stderr)
		require.Equal(t, [][]string{
			{id(held), "beta", "2026-11", "held", "500", "usd", "over_customer_cap"},
			{id(pending), "alpha", "2026-11", "pending", "300", "usd", "-"},
		}, rows(stdout))
		require.Empty(t, stderr)

		stdout, _, err = b.billingctl(ctx, "charges", "list", "--status", "held")
		require.NoError(t, err)
		require.Len(t, rows(stdout), 1)
		require.Equal(t, id(held), rows(stdout)[0][0])

		stdout, _, err = b.billingctl(ctx, "charges", "list", "--customer", "alpha")
		require.NoError(t, err)
		require.Len(t, rows(stdout), 1)
		require.Equal(t, id(pending), rows(stdout)[0][0])

		stdout, stderr, err = b.billingctl(ctx, "charges", "list", "--limit", "1")
		require.NoError(t, err)
		require.Len(t, rows(stdout), 1)
		require.Contains(t, stderr, "more charges follow: add --after "+id(held))
		stdout, _, err = b.billingctl(ctx, "charges", "list", "--limit", "1", "--after", id(held))
		require.NoError(t, err)
		require.Equal(t, id(pending), rows(stdout)[0][0])

		_, _, err = b.billingctl(ctx, "charges", "list", "--status", "hled")
		require.ErrorContains(t, err, `--status: unknown status "hled"`)
		_, _, err = b.billingctl(ctx, "charges", "list", "--limit", "0")
		require.ErrorContains(t, err, "--limit")
	})

	t.Run("MissingReason", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.capHeld(ctx, t, "acme")
		for _, cmd := range []string{"approve", "cancel"} {
			_, _, err := b.billingctl(ctx, "charges", cmd, id(c))
			require.ErrorContains(t, err, "--reason: is required", cmd)
		}
		_, _, err := b.billingctl(ctx, "charges", "approve", id(c), "--reason", strings.Repeat("x", ledger.ReasonMaxChars+1))
		require.ErrorContains(t, err, "--reason: is 1001 characters long")
		b.status(ctx, t, c.ID, ledger.ChargeHeld)
		require.Empty(t, b.actions(ctx, t, c.ID))
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		for _, args := range [][]string{
			{"charges", "approve", "999", "--reason", "x"},
			{"charges", "cancel", "999", "--reason", "x"},
			{"charges", "resolve", "999", "--keep", "pi_A", "--reason", "x"},
			{"charges", "show", "999"},
		} {
			_, _, err := b.billingctl(ctx, args...)
			require.EqualError(t, err, "charge 999 not found (see billingctl charges list)", "%v", args)
		}
	})

	t.Run("ResolveDoubleCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.doubleCharged(ctx, t, "acme")
		stdout, stderr, err := b.billingctl(ctx, "charges", "resolve", id(c), "--keep", "pi_A", "--reason", "the customer paid once, with pi_A")
		require.NoError(t, err, stderr)
		require.Contains(t, stdout, fmt.Sprintf("resolve of charge %d (acme/2026-11, 500 usd) requested: keep pi_A", c.ID))
		require.Contains(t, stdout, "stays held")
		b.status(ctx, t, c.ID, ledger.ChargeHeld)
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_resolve' AND args->>'keep_payment_intent' = 'pi_A' AND args->>'actor' = $1`, cliActor(b.env)))
		actions := b.actions(ctx, t, c.ID)
		require.Len(t, actions, 1)
		require.Equal(t, ledger.ActionResolve, actions[0].Action)
	})

	t.Run("ResolveNeedsAPaymentIntent", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.doubleCharged(ctx, t, "acme")
		for _, keep := range []string{"", "ch_1"} {
			_, _, err := b.billingctl(ctx, "charges", "resolve", id(c), "--keep", keep, "--reason", "x")
			require.ErrorContains(t, err, "--keep: must be the id of the PaymentIntent to keep", keep)
		}
		require.Zero(t, b.Count(t, `SELECT count(*) FROM river.river_job WHERE kind = 'charge_resolve'`))
	})

	t.Run("ResolveRefusesAnOtherHold", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.capHeld(ctx, t, "acme")
		_, _, err := b.billingctl(ctx, "charges", "resolve", id(c), "--keep", "pi_A", "--reason", "x")
		require.ErrorContains(t, err, "(charge_not_held)")
		require.ErrorContains(t, err, fmt.Sprintf("held for over_customer_cap; the way out: billingctl charges approve %d", c.ID))
	})

	t.Run("Show", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		// A call whose outcome was lost, then the reconciler holds the charge.
		c := b.closed(ctx, t, "acme", 500)
		cl, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 7, JobAttempt: 1})
		require.NoError(t, err)
		cl, err = b.Ledger.ChargeLookupNone(ctx, cl, "job:7/1")
		require.NoError(t, err)
		_, err = b.Ledger.ChargeRecordOutcome(ctx, cl, ledger.Outcome{Class: ledger.OutcomeUnknown, HTTPStatus: 500,
			StripeRequestID: "req_1", ErrorCode: "api_error", ErrorMessage: "upstream\ntimeout"}, "job:7/1", nil)
		require.NoError(t, err)
		_, err = b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "reconciler",
			Outcome: ledger.Outcome{Class: ledger.OutcomeHeld, HeldReason: ledger.HeldUnexpectedStatus, ErrorMessage: "requires_capture"}})
		require.NoError(t, err)
		_, stderr, err := b.billingctl(ctx, "charges", "cancel", id(c), "--reason", "try")
		require.ErrorContains(t, err, "(charge_outcome_unknown)", stderr)
		_, stderr, err = b.billingctl(ctx, "charges", "approve", id(c), "--reason", "reconciled by hand: nothing on Stripe")
		require.NoError(t, err, stderr)

		stdout, stderr, err := b.billingctl(ctx, "charges", "show", id(c))
		require.NoError(t, err, stderr)
		t.Logf("billingctl charges show:\n%s", stdout)
		require.True(t, strings.HasPrefix(stdout, fmt.Sprintf("charge %d  acme/2026-11  pending\n", c.ID)), stdout)
		for _, want := range []string{
			"amount:", "500 usd (1 events)",
			"requires_capture",
			"approved:", "look-up:",
			"lines (the amount is their sum): 1\n", "#1 pre-priced  1 events  500 usd\n",
			"attempts (Stripe calls): 1\n",
			"#1 gen 0", "unknown  http 500  req_1  error api_error: upstream timeout  (job 7)",
			"transitions: 4\n",
			"- → pending  by job:1/1: closed with 1 events totalling 500 usd",
			"pending → unknown  by job:7/1",
			"unknown → held  by reconciler: unexpected_status: requires_capture",
			"held → pending  by " + cliActor(b.env) + ": approved: reconciled by hand: nothing on Stripe",
			"operator actions: 1\n",
			"approve  by " + cliActor(b.env) + "  (held → pending): \"reconciled by hand: nothing on Stripe\"",
		} {
			require.Contains(t, stdout, want)
		}
		require.NotContains(t, stdout, "way out:", "no longer held")
	})

	t.Run("ShowCarriedRefundsAndDisputes", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		// November's 30 cents are below Stripe's minimum: carried into
		// December's charge, which is paid, then refunded and disputed.
		nov := b.closed(ctx, t, "acme", 30)
		cl, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: nov.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
		require.NoError(t, err)
		require.Nil(t, cl)
		b.Clock.Set(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))
		_, err = b.Ledger.UsageEventRecord(ctx, ledger.UsageEventParams{CustomerID: "acme", EventID: "dec-1", AmountCents: 1000})
		require.NoError(t, err)
		dec, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-12", Actor: "job:2/1"})
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `UPDATE billing.charges SET status = 'succeeded', stripe_payment_intent_id = 'pi_1',
       stripe_charge_id = 'ch_1' WHERE id = $1`, dec.ID)
		require.NoError(t, err)
		created := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
		due := created.Add(7 * 24 * time.Hour)
		for _, p := range []ledger.ChargeAdjustmentParams{
			{StripeID: "re_1", Status: "succeeded", EventID: "evt_1", EventType: "charge.refund.updated", AmountCents: 300,
				Reason: "requested_by_customer"},
			{StripeID: "re_2", Status: "failed", EventID: "evt_2", EventType: "charge.refund.updated", AmountCents: 50,
				FailureReason: "expired_or_canceled_card"},
		} {
			p.StripeChargeID, p.StripePaymentIntentID, p.Currency, p.CreatedAt = "ch_1", "pi_1", "usd", created
			require.NoError(t, b.Ledger.InTx(ctx, func(tx *ledger.Tx) error {
				_, err := b.Ledger.RefundRecordTx(ctx, tx, p)
				return err
			}))
		}
		require.NoError(t, b.Ledger.InTx(ctx, func(tx *ledger.Tx) error {
			_, err := b.Ledger.DisputeRecordTx(ctx, tx, ledger.ChargeAdjustmentParams{
				StripeID: "dp_1", StripeChargeID: "ch_1", StripePaymentIntentID: "pi_1", AmountCents: 1030, Currency: "usd",
				Status: "needs_response", Reason: "fraudulent", CreatedAt: created, EventID: "evt_3",
				EventType: "charge.dispute.created", EvidenceDueBy: &due})
			return err
		}))

		stdout, stderr, err := b.billingctl(ctx, "charges", "show", id(nov))
		require.NoError(t, err, stderr)
		require.Regexp(t, fmt.Sprintf(`\n  carried into: +charge %d, which bills this amount\n`, dec.ID), stdout)
		require.NotContains(t, stdout, "carried in:")
		require.Contains(t, stdout, "refunds: 0\n")
		require.Contains(t, stdout, "disputes: 0\n")

		stdout, stderr, err = b.billingctl(ctx, "charges", "show", id(dec))
		require.NoError(t, err, stderr)
		t.Logf("billingctl charges show:\n%s", stdout)
		require.Regexp(t, `\n  carried in: +30 usd of it from earlier charges below Stripe's minimum\n`, stdout)
		require.NotContains(t, stdout, "carried into:")
		for _, want := range []string{
			"refunds: 2\n",
			"  2026-12-03T09:00:00Z  re_1  succeeded  300 usd  of pi_1  reason requested_by_customer\n",
			"  2026-12-03T09:00:00Z  re_2  failed  50 usd  of pi_1  failure expired_or_canceled_card\n",
			"disputes: 1\n",
			"  2026-12-03T09:00:00Z  dp_1  needs_response  1030 usd  reason fraudulent  evidence due 2026-12-10T09:00:00Z\n",
		} {
			require.Contains(t, stdout, want)
		}
	})

	t.Run("ShowHeldSaysTheWayOut", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		c := b.doubleCharged(ctx, t, "acme")
		stdout, _, err := b.billingctl(ctx, "charges", "show", id(c))
		require.NoError(t, err)
		require.Contains(t, stdout, "held for:")
		require.Contains(t, stdout, "double_charge since")
		require.Regexp(t, fmt.Sprintf(`\n  way out: +billingctl charges resolve %d --keep pi_…`, c.ID), stdout)
		require.Contains(t, stdout, "operator actions: 0\n")
	})
}

func TestCharging(t *testing.T) {
	t.Parallel()

	// A resume outside Tally (a River client, SQL) is shown as the state
	// it is, with what the operator log lacks and the command to record it.
	t.Run("OutsideTally", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		_, stderr, err := b.billingctl(ctx, "charging", "pause", "--reason", "incident 42")
		require.NoError(t, err, stderr)
		require.NoError(t, b.River.QueueResume(ctx, "charges", nil))
		stdout, stderr, err := b.billingctl(ctx, "charging", "status")
		require.NoError(t, err, stderr)
		require.Regexp(t, `^charging is running \(resumed outside Tally\)\nWARNING: charging was paused by cli:\S+ at \S+ \("incident 42"\), `+
			`but River's charge queue is not paused: it was resumed outside Tally .*; record it with billingctl charging resume --reason`, stdout)

		_, stderr, err = b.billingctl(ctx, "charging", "resume", "--reason", "found resumed")
		require.NoError(t, err, stderr)
		stdout, _, err = b.billingctl(ctx, "charging", "status")
		require.NoError(t, err)
		require.NotContains(t, stdout, "WARNING")
	})

	t.Run("PauseStatusResume", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		status := func() string {
			t.Helper()
			stdout, stderr, err := b.billingctl(ctx, "charging", "status")
			require.NoError(t, err, stderr)
			return stdout
		}
		require.Equal(t, "charging is running (never paused)\n", status())

		stdout, stderr, err := b.billingctl(ctx, "charging", "pause", "--reason", "incident 42: wrong prices")
		require.NoError(t, err, stderr)
		require.Contains(t, stdout, "charging paused on every replica")
		require.Contains(t, stdout, "by "+cliActor(b.env)+`: "incident 42: wrong prices"`)
		st, err := b.Ledger.ChargingGet(ctx)
		require.NoError(t, err)
		require.True(t, st.Paused)
		require.Equal(t, cliActor(b.env), st.By)
		require.Regexp(t, `^charging is PAUSED \(since \S+ by cli:\S+: "incident 42: wrong prices"\): no charge or resolve job calls Stripe\n$`, status())

		stdout, stderr, err = b.billingctl(ctx, "charging", "resume", "--reason", "prices fixed")
		require.NoError(t, err, stderr)
		require.Contains(t, stdout, "charging resumed")
		require.Regexp(t, `^charging is running \(resumed: since \S+ by cli:\S+: "prices fixed"\)\n$`, status())
		st, err = b.Ledger.ChargingGet(ctx)
		require.NoError(t, err)
		require.False(t, st.Paused)
	})

	t.Run("RequiresAReason", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		for _, cmd := range []string{"pause", "resume"} {
			_, _, err := b.billingctl(ctx, "charging", cmd)
			require.ErrorContains(t, err, "--reason: is required", cmd)
		}
		st, err := b.Ledger.ChargingGet(ctx)
		require.NoError(t, err)
		require.False(t, st.Paused)
		require.Zero(t, b.Count(t, "SELECT count(*) FROM billing.operator_actions"))
	})

	t.Run("UnknownSubcommand", func(t *testing.T) {
		t.Parallel()
		ctx, b := chargesSetup(t)
		_, _, err := b.billingctl(ctx, "charging", "stop")
		require.ErrorContains(t, err, `unknown command "charging stop"`)
		_, _, err = b.billingctl(ctx, "charging")
		require.ErrorContains(t, err, "usage")
		_, _, err = b.billingctl(ctx, "charges")
		require.ErrorContains(t, err, "usage")
	})
}

func TestCLIActor(t *testing.T) {
	t.Parallel()
	env := func(user string) func(string) string {
		return func(k string) string {
			if k == "USER" {
				return user
			}
			return ""
		}
	}
	found := func() (*user.User, error) { return &user.User{Username: "alice"}, nil }
	missing := func() (*user.User, error) { return nil, errors.New("no passwd entry") }
	for _, tt := range []struct {
		name    string
		current func() (*user.User, error)
		user    string
		want    string
	}{
		{"OSUser", found, "bob", "cli:alice"},
		{"EnvWhenNoOSUser", missing, "bob", "cli:bob"},
		{"Unknown", missing, "", "cli:unknown"},
	} {
		require.Equal(t, tt.want, cliActorFrom(tt.current, env(tt.user)), tt.name)
	}
}

// A usage line names its metric, quantity, plan version and model, the
// tiers it reached, and its exact amount beside the rounded one.
func TestLineText(t *testing.T) {
	plan, err := pricing.ParsePlan([]byte(`{"currency":"usd","prices":{"api_calls":{"model":"graduated","tiers":[` +
		`{"up_to":"1000","unit_amount":"0.5"},{"up_to":null,"unit_amount":"0.1","flat_amount":"10"}]}}}`))
	require.NoError(t, err)
	q, err := pricing.ParseQuantity("1200.5")
	require.NoError(t, err)
	rated, err := pricing.Rate(plan.Prices["api_calls"], q)
	require.NoError(t, err)
	li := ledger.ChargeLine{Line: 1, Kind: ledger.ChargeLineUsage, EventCount: 2, ExactAmount: rated.Exact, AmountCents: rated.Amount,
		Usage: &ledger.UsageRating{Metric: "api_calls", PlanID: "std", PlanVersion: 3, Rated: rated}}
	require.Equal(t, "usage       api_calls  1200.5 (2 events)  plan std v3 graduated  [tier 1: 1000 × 0.5 + 0]"+
		"  [tier 2: 200.5 × 0.1 + 10]  530.05 → 530 usd", lineText(li, "usd"))
	require.Equal(t, "carried     30 usd from earlier charges",
		lineText(ledger.ChargeLine{Kind: ledger.ChargeLineCarried, AmountCents: 30}, "usd"))
}
