package api_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/ledger"
)

// chargeBody is a charge as GET /v1/charges/{id} and the actions answer it.
type chargeBody struct {
	ID                    int64      `json:"id"`
	CustomerID            string     `json:"customer_id"`
	Period                string     `json:"period"`
	Status                string     `json:"status"`
	AmountCents           int64      `json:"amount_cents"`
	StripePaymentIntentID *string    `json:"stripe_payment_intent_id"`
	HeldReason            *string    `json:"held_reason"`
	HeldDetail            *string    `json:"held_detail"`
	HeldAt                *time.Time `json:"held_at"`
	ApprovedAt            *time.Time `json:"approved_at"`
	LookupRequired        bool       `json:"lookup_required"`
	Attempts              []struct {
		Outcome *string `json:"outcome"`
	} `json:"attempts"`
	Transitions []struct {
		From   *string   `json:"from"`
		To     string    `json:"to"`
		Actor  string    `json:"actor"`
		Reason *string   `json:"reason"`
		At     time.Time `json:"at"`
	} `json:"transitions"`
	Actions        []actionBody `json:"actions"`
	CarriedInCents int64        `json:"carried_in_cents"`
	CarriedInto    *int64       `json:"carried_into"`
	Refunds        []struct {
		StripeRefundID string     `json:"stripe_refund_id"`
		Status         string     `json:"status"`
		AmountCents    int64      `json:"amount_cents"`
		Currency       string     `json:"currency"`
		FailureReason  *string    `json:"failure_reason"`
		StatusAt       *time.Time `json:"status_at"`
	} `json:"refunds"`
	Disputes []struct {
		StripeDisputeID string     `json:"stripe_dispute_id"`
		Status          string     `json:"status"`
		AmountCents     int64      `json:"amount_cents"`
		Reason          *string    `json:"reason"`
		EvidenceDueBy   *time.Time `json:"evidence_due_by"`
	} `json:"disputes"`
}

// actionBody is one operator action as GET /v1/charges/{id} answers it.
type actionBody struct {
	Action       string         `json:"action"`
	Actor        string         `json:"actor"`
	Reason       string         `json:"reason"`
	StatusBefore *string        `json:"status_before"`
	StatusAfter  *string        `json:"status_after"`
	Detail       map[string]any `json:"detail"`
	At           time.Time      `json:"at"`
}

// resolveBody is the 202 answer of POST /v1/charges/{id}/resolve.
type resolveBody struct {
	Charge            chargeBody `json:"charge"`
	KeepPaymentIntent string     `json:"keep_payment_intent"`
	Note              string     `json:"note"`
}

// actor is the actor the all-scopes key acts as.
func (b *testBundle) actor() string {
	return "operator:all/" + b.secret[:len("tly_")+10]
}

// closedCharge posts one acme event of amount and closes November as the
// charge job would (the guards have not run yet): a pending charge.
func (b *testBundle) closedCharge(ctx context.Context, t *testing.T, amount int64) *ledger.Charge {
	t.Helper()
	require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("e1", amount)).Code)
	c, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-11", Actor: "job:1/1"})
	require.NoError(t, err)
	require.Equal(t, ledger.ChargePending, c.Status)
	return c
}

// claim claims c as the first run of its charge job does, and returns the
// claim (nil when the guards held the charge).
func (b *testBundle) claim(ctx context.Context, t *testing.T, c *ledger.Charge) *ledger.Claim {
	t.Helper()
	cl, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
	require.NoError(t, err)
	return cl
}

// capHeldCharge returns a charge of 500 held over_customer_cap: acme's
// max_charge_cents is 100, and the claim's guard held it.
func (b *testBundle) capHeldCharge(ctx context.Context, t *testing.T) *ledger.Charge {
	t.Helper()
	limit := int64(100)
	_, _, err := b.Ledger.CustomerPut(ctx, ledger.CustomerPutParams{ID: "acme", StripeCustomerID: "cus_acme", Currency: "usd", MaxChargeCents: &limit})
	require.NoError(t, err)
	c := b.closedCharge(ctx, t, 500)
	require.Nil(t, b.claim(ctx, t, c), "held: nothing to call")
	return b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
}

// doubleChargeHeld returns a charge the reconciler held for a double charge
// (two PaymentIntents carry its key: pi_A and pi_B).
func (b *testBundle) doubleChargeHeld(ctx context.Context, t *testing.T) *ledger.Charge {
	t.Helper()
	c := b.closedCharge(ctx, t, 500)
	_, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "reconciler",
		Outcome: ledger.Outcome{Class: ledger.OutcomeHeld, HeldReason: ledger.HeldDoubleCharge, ErrorMessage: "pi_A, pi_B"}})
	require.NoError(t, err)
	c = b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
	require.Equal(t, ledger.HeldDoubleCharge, *c.HeldReason)
	return c
}

// holdUnexpected holds c as the reconciler does when Stripe answers a status
// Tally never expects; a worker's lease on c stays.
func (b *testBundle) holdUnexpected(ctx context.Context, t *testing.T, c *ledger.Charge) *ledger.Charge {
	t.Helper()
	_, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "reconciler",
		Outcome: ledger.Outcome{Class: ledger.OutcomeHeld, HeldReason: ledger.HeldUnexpectedStatus, ErrorMessage: "requires_capture"}})
	require.NoError(t, err)
	return b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
}

// requireStatus requires the stored charge id to be in status, and returns it.
func (b *testBundle) requireStatus(ctx context.Context, t *testing.T, id int64, status ledger.ChargeStatus) *ledger.Charge {
	t.Helper()
	c, err := b.Ledger.ChargeGet(ctx, id)
	require.NoError(t, err)
	require.Equal(t, status, c.Status)
	return c
}

// getCharge answers GET /v1/charges/{id}.
func (b *testBundle) getCharge(t *testing.T, id int64) chargeBody {
	t.Helper()
	rec := b.do(http.MethodGet, fmt.Sprintf("/v1/charges/%d", id), "")
	require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	return decodeJSON[chargeBody](t, rec)
}

// actionCount counts the recorded operator actions.
func (b *testBundle) actionCount(t *testing.T) int64 {
	t.Helper()
	return b.Count(t, "SELECT count(*) FROM billing.operator_actions")
}

func chargePath(id int64, action string) string { return fmt.Sprintf("/v1/charges/%d/%s", id, action) }

func reasonJSON(reason string) string { return fmt.Sprintf(`{"reason":%q}`, reason) }

func TestChargeActionAuth(t *testing.T) {
	t.Parallel()
	ctx, b := setup(t, setupOpts{})
	c := b.doubleChargeHeld(ctx, t)
	readOnly := b.apiKey(ctx, t, "all-but-admin", slices.DeleteFunc(slices.Clone(ledger.Scopes), func(s ledger.Scope) bool { return s == ledger.ScopeAdmin })...)

	for _, route := range []struct{ method, path, body string }{
		{http.MethodPost, chargePath(c.ID, "approve"), reasonJSON("x")},
		{http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("x")},
		{http.MethodPost, chargePath(c.ID, "retry"), ""},
		{http.MethodPost, chargePath(c.ID, "resolve"), `{"keep_payment_intent":"pi_A","reason":"x"}`},
		{http.MethodGet, "/v1/admin/charging", ""},
		{http.MethodPost, "/v1/admin/charging/pause", reasonJSON("x")},
		{http.MethodPost, "/v1/admin/charging/resume", reasonJSON("x")},
	} {
		req := b.newRequest(route.method, route.path, route.body)
		req.Header.Del("Authorization")
		requireProblem(t, b.serve(req), http.StatusUnauthorized, "unauthenticated")

		req = b.newRequest(route.method, route.path, route.body)
		req.Header.Set("Authorization", "Bearer "+readOnly)
		p := requireProblem(t, b.serve(req), http.StatusForbidden, "forbidden")
		require.Contains(t, p.Detail, string(ledger.ScopeAdmin), "%s %s", route.method, route.path)
	}
	require.Zero(t, b.actionCount(t), "no refused request acted")
	b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
	require.Zero(t, b.Count(t, "SELECT count(*) FROM river.river_job WHERE kind = 'charge_resolve'"))
	st, err := b.Ledger.ChargingGet(ctx)
	require.NoError(t, err)
	require.False(t, st.Paused)
}

func TestChargeApprove(t *testing.T) {
	t.Parallel()

	t.Run("ApprovesAHeldCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.capHeldCharge(ctx, t)
		require.Equal(t, "scheduled", b.chargeJobState(t), "the charge job waits for the period's close time")

		rec := b.do(http.MethodPost, chargePath(c.ID, "approve"), reasonJSON("agreed with the customer"))
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		got := decodeJSON[chargeBody](t, rec)
		require.Equal(t, c.ID, got.ID)
		require.Equal(t, "pending", got.Status)
		require.NotNil(t, got.ApprovedAt)
		require.True(t, got.ApprovedAt.Equal(b.Clock.Now()))
		require.False(t, got.LookupRequired, "never called: its first call looks at Stripe anyway")
		require.Equal(t, "available", b.chargeJobState(t), "its charge job runs now")

		actions, err := b.Ledger.ChargeActions(ctx, c.ID)
		require.NoError(t, err)
		require.Len(t, actions, 1)
		require.Equal(t, ledger.ActionApprove, actions[0].Action)
		require.Equal(t, b.actor(), actions[0].Actor)
		require.Equal(t, "agreed with the customer", actions[0].Reason)

		// The guard that held it is waived: the next claim calls.
		cl := b.claim(ctx, t, c)
		require.NotNil(t, cl)
		require.True(t, cl.Lookup)
	})

	t.Run("BadID", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.do(http.MethodPost, "/v1/charges/abc/approve", reasonJSON("x")), "id")
	})

	t.Run("DoubleChargeIsNotApprovable", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.doubleChargeHeld(ctx, t)
		p := requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "approve"), reasonJSON("looks fine")), http.StatusConflict, "charge_not_held")
		require.Contains(t, p.Detail, "double_charge")
		require.Contains(t, p.Detail, "resolve")
		b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
		require.Zero(t, b.actionCount(t))
	})

	t.Run("Leased", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		// A worker is calling Stripe when the reconciler holds the charge.
		c := b.closedCharge(ctx, t, 500)
		require.NotNil(t, b.claim(ctx, t, c))
		c = b.holdUnexpected(ctx, t, c)
		require.NotNil(t, c.LeaseOwner)

		p := requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "approve"), reasonJSON("checked")), http.StatusConflict, "charge_leased")
		require.Contains(t, p.Detail, "try again")
		require.Zero(t, b.actionCount(t))

		_, err := b.Pool.Exec(ctx, `UPDATE billing.charges SET lease_expires_at = now() - interval '1 second' WHERE lease_owner IS NOT NULL`) // the lease passes (Postgres's clock)
		require.NoError(t, err)
		rec := b.do(http.MethodPost, chargePath(c.ID, "approve"), reasonJSON("checked"))
		require.Equal(t, http.StatusOK, rec.Code, "once the lease has passed; body: %s", rec.Body)
		require.Equal(t, "pending", decodeJSON[chargeBody](t, rec).Status)
	})

	t.Run("MissingReason", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.capHeldCharge(ctx, t)
		for _, body := range []string{`{}`, `{"reason":""}`, `{"reason":"  \n"}`} {
			p := requireInvalid(t, b.do(http.MethodPost, chargePath(c.ID, "approve"), body), "reason")
			require.Contains(t, p.Errors["reason"], "required", body)
		}
		b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
		require.Zero(t, b.actionCount(t))
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireProblem(t, b.do(http.MethodPost, chargePath(999, "approve"), reasonJSON("x")), http.StatusNotFound, "not_found")
		require.Zero(t, b.actionCount(t))
	})

	t.Run("NotHeld", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.closedCharge(ctx, t, 500)
		p := requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "approve"), reasonJSON("x")), http.StatusConflict, "charge_not_held")
		require.Contains(t, p.Detail, "pending")
		b.requireStatus(ctx, t, c.ID, ledger.ChargePending)
		require.Zero(t, b.actionCount(t))
	})

	t.Run("ReasonTooLong", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.capHeldCharge(ctx, t)
		p := requireInvalid(t, b.do(http.MethodPost, chargePath(c.ID, "approve"), reasonJSON(strings.Repeat("é", ledger.ReasonMaxChars+1))), "reason")
		require.Contains(t, p.Errors["reason"], "1001")
		rec := b.do(http.MethodPost, chargePath(c.ID, "approve"), reasonJSON(strings.Repeat("é", ledger.ReasonMaxChars)))
		require.Equal(t, http.StatusOK, rec.Code, "at the limit; body: %s", rec.Body)
	})

	t.Run("StrictBody", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.capHeldCharge(ctx, t)
		path := chargePath(c.ID, "approve")
		requireInvalid(t, b.do(http.MethodPost, path, `{"reason":"x","force":true}`), "force")
		requireInvalid(t, b.do(http.MethodPost, path, `{"Reason":"x"}`), "Reason")
		requireInvalid(t, b.do(http.MethodPost, path, `{"reason":"x","reason":"y"}`), "reason")
		requireInvalid(t, b.do(http.MethodPost, path, `{"reason":5}`), "reason")
		requireProblem(t, b.do(http.MethodPost, path, `{"reason":`), http.StatusBadRequest, "malformed_json")
		requireProblem(t, b.do(http.MethodPost, path, `{"reason":"x"} {}`), http.StatusBadRequest, "malformed_json")
		req := b.newRequest(http.MethodPost, path, reasonJSON("x"))
		req.Header.Set("Content-Type", "text/plain")
		requireProblem(t, b.serve(req), http.StatusUnsupportedMediaType, "unsupported_media_type")
		requireProblem(t, b.do(http.MethodPost, path, ""), http.StatusUnsupportedMediaType, "unsupported_media_type")
		b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
		require.Zero(t, b.actionCount(t))
	})
}

// chargeJobState returns the state of acme's charge job.
func (b *testBundle) chargeJobState(t *testing.T) string {
	t.Helper()
	var state string
	require.NoError(t, b.Pool.QueryRow(t.Context(), `SELECT state FROM river.river_job WHERE kind = 'charge_period'`).Scan(&state))
	return state
}

func TestChargeCancel(t *testing.T) {
	t.Parallel()

	t.Run("CancelsAHeldCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.capHeldCharge(ctx, t)
		rec := b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("customer disputes the usage"))
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Equal(t, "canceled", decodeJSON[chargeBody](t, rec).Status)
		require.Nil(t, b.claim(ctx, t, c), "a canceled charge is never claimed")
	})

	t.Run("CancelsAPendingCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.closedCharge(ctx, t, 500)
		rec := b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("billed by hand"))
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Equal(t, "canceled", decodeJSON[chargeBody](t, rec).Status)
	})

	t.Run("DoubleChargeOutcomeUnknown", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.doubleChargeHeld(ctx, t)
		p := requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("x")), http.StatusConflict, "charge_outcome_unknown")
		require.Contains(t, p.Detail, "reconcile")
		b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
		require.Zero(t, b.actionCount(t))
	})

	t.Run("Leased", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.closedCharge(ctx, t, 500)
		require.NotNil(t, b.claim(ctx, t, c))
		p := requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("x")), http.StatusConflict, "charge_leased")
		require.Contains(t, p.Detail, "lease held by w")
		b.requireStatus(ctx, t, c.ID, ledger.ChargePending)
		require.Zero(t, b.actionCount(t))

		// The run died before any Stripe call (its look-up found nothing to
		// record yet): once its lease has passed, nothing can have moved.
		_, err := b.Pool.Exec(ctx, `UPDATE billing.charges SET lease_expires_at = now() - interval '1 second' WHERE lease_owner IS NOT NULL`) // the lease passes (Postgres's clock)
		require.NoError(t, err)
		rec := b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("x"))
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
	})

	t.Run("MissingReason", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.capHeldCharge(ctx, t)
		requireInvalid(t, b.do(http.MethodPost, chargePath(c.ID, "cancel"), `{}`), "reason")
		b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
		require.Zero(t, b.actionCount(t))
	})

	t.Run("NotCancelable", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.capHeldCharge(ctx, t)
		require.Equal(t, http.StatusOK, b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("x")).Code)
		p := requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("again")), http.StatusConflict, "charge_not_cancelable")
		require.Contains(t, p.Detail, "canceled")
		require.Equal(t, int64(1), b.actionCount(t))
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireProblem(t, b.do(http.MethodPost, chargePath(999, "cancel"), reasonJSON("x")), http.StatusNotFound, "not_found")
	})

	t.Run("UnknownAttemptOutcomeUnknown", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.closedCharge(ctx, t, 500)
		cl, err := b.Ledger.ChargeLookupNone(ctx, b.claim(ctx, t, c), "job:1/1")
		require.NoError(t, err)
		_, err = b.Ledger.ChargeRecordOutcome(ctx, cl, ledger.Outcome{Class: ledger.OutcomeUnknown}, "job:1/1", nil)
		require.NoError(t, err)
		p := requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("x")), http.StatusConflict, "charge_outcome_unknown")
		require.Contains(t, p.Detail, "billingctl reconcile --customer acme --period 2026-11")
		b.requireStatus(ctx, t, c.ID, ledger.ChargeUnknown)

		// Held later, the attempt whose outcome is unknown still forbids it.
		b.holdUnexpected(ctx, t, c)
		p = requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("x")), http.StatusConflict, "charge_outcome_unknown")
		require.Contains(t, p.Detail, "billingctl reconcile --customer acme --period 2026-11")
		b.requireStatus(ctx, t, c.ID, ledger.ChargeHeld)
		require.Zero(t, b.actionCount(t))
	})
}

func TestChargeResolve(t *testing.T) {
	t.Parallel()

	resolveJobs := func(t *testing.T, b *testBundle) int64 {
		t.Helper()
		return b.Count(t, "SELECT count(*) FROM river.river_job WHERE kind = 'charge_resolve'")
	}

	t.Run("Accepted", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.doubleChargeHeld(ctx, t)
		rec := b.do(http.MethodPost, chargePath(c.ID, "resolve"), `{"keep_payment_intent":"pi_A","reason":"the customer paid once, with pi_A"}`)
		require.Equal(t, http.StatusAccepted, rec.Code, "body: %s", rec.Body)
		require.Equal(t, fmt.Sprintf("/v1/charges/%d", c.ID), rec.Header().Get("Location"))
		got := decodeJSON[resolveBody](t, rec)
		require.Equal(t, c.ID, got.Charge.ID)
		require.Equal(t, "held", got.Charge.Status, "held until the resolve job has refunded and settled")
		require.Equal(t, "double_charge", *got.Charge.HeldReason)
		require.Equal(t, "pi_A", got.KeepPaymentIntent)
		require.Contains(t, got.Note, "refund")
		require.Contains(t, got.Note, "pi_A")

		require.Equal(t, int64(1), resolveJobs(t, b))
		require.Equal(t, int64(1), b.Count(t, `SELECT count(*) FROM river.river_job
WHERE kind = 'charge_resolve' AND queue = 'charges' AND args->>'keep_payment_intent' = 'pi_A' AND args->>'actor' = $1
  AND (args->>'charge_id')::bigint = $2`, b.actor(), c.ID))
		actions := b.getCharge(t, c.ID).Actions
		require.Len(t, actions, 1)
		require.Equal(t, "resolve", actions[0].Action)
		require.Equal(t, b.actor(), actions[0].Actor)
		require.Equal(t, map[string]any{"keep_payment_intent": "pi_A", "state": "requested"}, actions[0].Detail)
	})

	t.Run("BadKeepPaymentIntent", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.doubleChargeHeld(ctx, t)
		for _, body := range []string{
			`{"keep_payment_intent":"ch_1","reason":"x"}`,
			`{"keep_payment_intent":"","reason":"x"}`,
			`{"reason":"x"}`,
			`{"keep_payment_intent":"pi_1\u0000","reason":"x"}`,
			`{"keep_payment_intent":["pi_1"],"reason":"x"}`,
		} {
			requireInvalid(t, b.do(http.MethodPost, chargePath(c.ID, "resolve"), body), "keep_payment_intent")
		}
		require.Zero(t, resolveJobs(t, b))
		require.Zero(t, b.actionCount(t))
	})

	t.Run("MissingReason", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.doubleChargeHeld(ctx, t)
		requireInvalid(t, b.do(http.MethodPost, chargePath(c.ID, "resolve"), `{"keep_payment_intent":"pi_A"}`), "reason")
		require.Zero(t, resolveJobs(t, b))
	})

	t.Run("NotADoubleCharge", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.capHeldCharge(ctx, t)
		body := `{"keep_payment_intent":"pi_A","reason":"x"}`
		requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "resolve"), body), http.StatusConflict, "charge_not_held")
		_, err := b.Ledger.ChargeCancel(ctx, ledger.ChargeActionParams{ChargeID: c.ID, Actor: "operator:test", Reason: "x"})
		require.NoError(t, err)
		requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "resolve"), body), http.StatusConflict, "charge_not_held")
		require.Zero(t, resolveJobs(t, b))
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireProblem(t, b.do(http.MethodPost, chargePath(999, "resolve"), `{"keep_payment_intent":"pi_A","reason":"x"}`), http.StatusNotFound, "not_found")
	})

	t.Run("UnknownField", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.doubleChargeHeld(ctx, t)
		requireInvalid(t, b.do(http.MethodPost, chargePath(c.ID, "resolve"), `{"keep_payment_intent":"pi_A","refund":"pi_B","reason":"x"}`), "refund")
		require.Zero(t, resolveJobs(t, b))
	})
}

func TestCharging(t *testing.T) {
	t.Parallel()

	type chargingBody struct {
		Paused bool       `json:"paused"`
		Since  *time.Time `json:"since"`
		By     *string    `json:"by"`
		Reason *string    `json:"reason"`
	}
	get := func(t *testing.T, b *testBundle) chargingBody {
		t.Helper()
		rec := b.do(http.MethodGet, "/v1/admin/charging", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		return decodeJSON[chargingBody](t, rec)
	}

	t.Run("MissingReason", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.do(http.MethodPost, "/v1/admin/charging/pause", `{}`), "reason")
		requireInvalid(t, b.do(http.MethodPost, "/v1/admin/charging/resume", `{"reason":""}`), "reason")
		require.False(t, get(t, b).Paused)
		require.Zero(t, b.actionCount(t))
	})

	t.Run("NeverPaused", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		rec := b.do(http.MethodGet, "/v1/admin/charging", "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.JSONEq(t, `{"paused":false,"since":null,"by":null,"reason":null,"discrepancy":null}`, rec.Body.String())
	})

	t.Run("PauseThenResume", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.closedCharge(ctx, t, 500)

		rec := b.do(http.MethodPost, "/v1/admin/charging/pause", reasonJSON("incident 42: wrong prices"))
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		paused := decodeJSON[chargingBody](t, rec)
		require.True(t, paused.Paused)
		require.Equal(t, b.actor(), *paused.By)
		require.Equal(t, "incident 42: wrong prices", *paused.Reason)
		require.NotNil(t, paused.Since, "since River paused the queue")
		require.Equal(t, paused, get(t, b))

		// Every replica's claim meets the pause.
		_, err := b.Ledger.ChargeClaim(ctx, ledger.ChargeClaimParams{ChargeID: c.ID, Owner: "w", LeaseTTL: time.Minute, JobID: 1, JobAttempt: 1})
		require.ErrorIs(t, err, ledger.ErrChargingPaused)

		b.Clock.Advance(time.Hour)
		rec = b.do(http.MethodPost, "/v1/admin/charging/resume", reasonJSON("prices fixed"))
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		resumed := decodeJSON[chargingBody](t, rec)
		require.False(t, resumed.Paused)
		require.Equal(t, b.actor(), *resumed.By)
		require.Equal(t, "prices fixed", *resumed.Reason)
		require.True(t, resumed.Since.Equal(b.Clock.Now()), "since: %v", resumed.Since)
		require.Equal(t, resumed, get(t, b))
		require.NotNil(t, b.claim(ctx, t, c))
		require.Equal(t, int64(2), b.Count(t, "SELECT count(*) FROM billing.operator_actions WHERE action IN ('charging_pause', 'charging_resume') AND actor = $1", b.actor()))
	})

	t.Run("UnknownField", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireInvalid(t, b.do(http.MethodPost, "/v1/admin/charging/pause", `{"reason":"x","queues":["charges"]}`), "queues")
		require.False(t, get(t, b).Paused)
	})
}

func TestChargeGet(t *testing.T) {
	t.Parallel()

	t.Run("ActionsAndHistory", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.capHeldCharge(ctx, t)
		held := b.getCharge(t, c.ID)
		require.Equal(t, "held", held.Status)
		require.Equal(t, "over_customer_cap", *held.HeldReason)
		require.Contains(t, *held.HeldDetail, "max_charge_cents 100")
		require.NotNil(t, held.HeldAt)
		require.Empty(t, held.Actions)

		approvedAt := b.Clock.Now()
		require.Equal(t, http.StatusOK, b.do(http.MethodPost, chargePath(c.ID, "approve"), reasonJSON("agreed with the customer")).Code)
		b.Clock.Advance(time.Minute)
		require.Equal(t, http.StatusOK, b.do(http.MethodPost, chargePath(c.ID, "cancel"), reasonJSON("the customer changed their mind")).Code)

		got := b.getCharge(t, c.ID)
		require.Equal(t, "canceled", got.Status)
		require.Empty(t, got.Attempts)
		require.Len(t, got.Actions, 2)
		approve, cancel := got.Actions[0], got.Actions[1]
		require.Equal(t, actionBody{Action: "approve", Actor: b.actor(), Reason: "agreed with the customer",
			StatusBefore: ptr("held"), StatusAfter: ptr("pending"), Detail: map[string]any{}, At: approve.At}, approve)
		require.True(t, approve.At.Equal(approvedAt))
		require.Equal(t, actionBody{Action: "cancel", Actor: b.actor(), Reason: "the customer changed their mind",
			StatusBefore: ptr("pending"), StatusAfter: ptr("canceled"), Detail: map[string]any{}, At: cancel.At}, cancel)
		require.True(t, cancel.At.Equal(approvedAt.Add(time.Minute)))

		var moves []string
		for _, tr := range got.Transitions {
			from := "-"
			if tr.From != nil {
				from = *tr.From
			}
			moves = append(moves, from+"→"+tr.To+" by "+tr.Actor)
		}
		require.Equal(t, []string{
			"-→pending by job:1/1",
			"pending→held by job:1/1",
			"held→pending by " + b.actor(),
			"pending→canceled by " + b.actor(),
		}, moves)
		require.Equal(t, "approved: agreed with the customer", *got.Transitions[2].Reason)
	})

	t.Run("CarriedRefundsAndDisputes", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		// November's 30 cents are below Stripe's minimum: carried into
		// December's charge, which is paid, then partly refunded and
		// disputed.
		nov := b.closedCharge(ctx, t, 30)
		require.Nil(t, b.claim(ctx, t, nov))
		b.requireStatus(ctx, t, nov.ID, ledger.ChargeCarriedForward)
		b.Clock.Set(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))
		require.Equal(t, http.StatusCreated, b.postEvent(eventJSON("dec-1", 1000)).Code)
		dec, err := b.Ledger.PeriodClose(ctx, ledger.PeriodCloseParams{CustomerID: "acme", Period: "2026-12", Actor: "job:2/1"})
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `UPDATE billing.charges SET status = 'succeeded', stripe_payment_intent_id = 'pi_1',
       stripe_charge_id = 'ch_1' WHERE id = $1`, dec.ID)
		require.NoError(t, err)
		created := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
		due := created.Add(7 * 24 * time.Hour)
		for _, p := range []ledger.ChargeAdjustmentParams{
			{StripeID: "re_1", Status: "pending", EventID: "evt_1", EventType: "refund.created", AmountCents: 300},
			{StripeID: "re_1", Status: "succeeded", EventID: "evt_2", EventType: "charge.refund.updated", AmountCents: 300},
			{StripeID: "re_2", Status: "failed", EventID: "evt_3", EventType: "charge.refund.updated", AmountCents: 50,
				FailureReason: "expired_or_canceled_card"},
		} {
			p.StripeChargeID, p.StripePaymentIntentID, p.Currency, p.CreatedAt, p.EventCreatedAt = "ch_1", "pi_1", "usd", created, created
			require.NoError(t, b.Ledger.InTx(ctx, func(tx *ledger.Tx) error {
				_, err := b.Ledger.RefundRecordTx(ctx, tx, p)
				return err
			}))
		}
		require.NoError(t, b.Ledger.InTx(ctx, func(tx *ledger.Tx) error {
			_, err := b.Ledger.DisputeRecordTx(ctx, tx, ledger.ChargeAdjustmentParams{
				StripeID: "dp_1", StripeChargeID: "ch_1", StripePaymentIntentID: "pi_1", AmountCents: 1030, Currency: "usd",
				Status: "needs_response", Reason: "fraudulent", CreatedAt: created, EventID: "evt_4",
				EventType: "charge.dispute.created", EventCreatedAt: created, EvidenceDueBy: &due})
			return err
		}))

		got := b.getCharge(t, nov.ID)
		require.Equal(t, "carried_forward", got.Status)
		require.Equal(t, &dec.ID, got.CarriedInto)
		require.Zero(t, got.CarriedInCents)
		require.Empty(t, got.Refunds)
		require.Empty(t, got.Disputes)

		got = b.getCharge(t, dec.ID)
		require.Equal(t, int64(1030), got.AmountCents)
		require.Equal(t, int64(30), got.CarriedInCents)
		require.Nil(t, got.CarriedInto)
		require.Len(t, got.Refunds, 2)
		require.Equal(t, "re_1", got.Refunds[0].StripeRefundID)
		require.Equal(t, "succeeded", got.Refunds[0].Status)
		require.Equal(t, int64(300), got.Refunds[0].AmountCents)
		require.Equal(t, "usd", got.Refunds[0].Currency)
		require.True(t, got.Refunds[0].StatusAt.Equal(created))
		require.Equal(t, "re_2", got.Refunds[1].StripeRefundID)
		require.Equal(t, "failed", got.Refunds[1].Status)
		require.Equal(t, "expired_or_canceled_card", *got.Refunds[1].FailureReason)
		require.Len(t, got.Disputes, 1)
		require.Equal(t, "dp_1", got.Disputes[0].StripeDisputeID)
		require.Equal(t, "needs_response", got.Disputes[0].Status)
		require.Equal(t, int64(1030), got.Disputes[0].AmountCents)
		require.Equal(t, "fraudulent", *got.Disputes[0].Reason)
		require.True(t, got.Disputes[0].EvidenceDueBy.Equal(due))
	})

	t.Run("NoActions", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		c := b.closedCharge(ctx, t, 500)
		rec := b.do(http.MethodGet, fmt.Sprintf("/v1/charges/%d", c.ID), "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		require.Contains(t, rec.Body.String(), `"actions":[]`)
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		_, b := setup(t, setupOpts{})
		requireProblem(t, b.do(http.MethodGet, "/v1/charges/999", ""), http.StatusNotFound, "not_found")
	})
}

func ptr[T any](v T) *T { return &v }

// pastDueCharge returns a charge that Stripe declined with a card error,
// past_due with its first retry an hour away.
func (b *testBundle) pastDueCharge(ctx context.Context, t *testing.T) *ledger.Charge {
	t.Helper()
	c := b.closedCharge(ctx, t, 500)
	_, err := b.Ledger.ChargeReconcile(ctx, ledger.ChargeReconcileParams{ChargeID: c.ID, Actor: "webhook:evt_1",
		Outcome: ledger.Outcome{Class: ledger.OutcomeFailed, StripePaymentIntentID: "pi_declined", ErrorCode: "card_declined"}})
	require.NoError(t, err)
	c = b.requireStatus(ctx, t, c.ID, ledger.ChargePastDue)
	require.True(t, c.NextRetryAt.Equal(b.Clock.Now().Add(time.Hour)))
	return c
}

func TestChargeRetry(t *testing.T) {
	t.Parallel()
	opts := setupOpts{ledger: ledger.Config{DunningSchedule: []time.Duration{time.Hour, 2 * time.Hour}}}

	t.Run("RetriesAPastDueChargeNow", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		c := b.pastDueCharge(ctx, t)

		rec := b.do(http.MethodPost, chargePath(c.ID, "retry"), "")
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		got := decodeJSON[map[string]any](t, rec)
		require.Equal(t, "past_due", got["status"])
		require.Equal(t, b.Clock.Now().UTC().Format(time.RFC3339), got["next_retry_at"], "due now")
		require.Equal(t, "available", b.chargeJobState(t), "its charge job runs now")
		actions, err := b.Ledger.ChargeActions(ctx, c.ID)
		require.NoError(t, err)
		require.Len(t, actions, 1)
		require.Equal(t, ledger.ActionRetry, actions[0].Action)
		require.Equal(t, ledger.ChargeRetryReasonDefault, actions[0].Reason)

		rec = b.do(http.MethodPost, chargePath(c.ID, "retry"), reasonJSON("new card on file"))
		require.Equal(t, http.StatusOK, rec.Code, "body: %s", rec.Body)
		actions, err = b.Ledger.ChargeActions(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, "new card on file", actions[1].Reason)
	})

	t.Run("RefusesAChargeNotPastDue", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, opts)
		c := b.capHeldCharge(ctx, t)
		p := requireProblem(t, b.do(http.MethodPost, chargePath(c.ID, "retry"), ""), http.StatusConflict, "charge_not_past_due")
		require.Contains(t, p.Detail, "held")
		require.Zero(t, b.actionCount(t))
		requireProblem(t, b.do(http.MethodPost, chargePath(c.ID+100, "retry"), ""), http.StatusNotFound, "not_found")
		requireInvalid(t, b.do(http.MethodPost, "/v1/charges/abc/retry", ""), "id")
	})
}
