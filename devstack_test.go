package tally_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/proc"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// devStack is the stack `make run` starts (scripts/run-dev.sh), moved to
// free loopback ports and a database of its own.
type devStack struct {
	HTTPAddr    string
	SimAddr     string
	MetricsAddr string
	DBName      string
	DBURL       string
	KeyFile     string
	LogPath     string
}

// startDevStack runs scripts/run-dev.sh as `make run` does, with only its
// TALLY_DEV_* addresses, database and key file moved, waits until the
// server is ready, and stops it when t ends.
func startDevStack(ctx context.Context, t *testing.T) *devStack {
	t.Helper()
	s := &devStack{
		HTTPAddr: freeAddr(t), SimAddr: freeAddr(t), MetricsAddr: freeAddr(t),
		DBURL:   testdb.NewEmpty(t),
		KeyFile: filepath.Join(t.TempDir(), "dev-api-key"),
		LogPath: filepath.Join(t.TempDir(), "run-dev.log"),
	}
	u, err := url.Parse(s.DBURL)
	require.NoError(t, err)
	s.DBName = strings.TrimPrefix(u.Path, "/")
	stack := &proc.Proc{
		Name: "run-dev",
		Bin:  "bash",
		Args: []string{"scripts/run-dev.sh"},
		Env: []string{
			"TALLY_DEV_HTTP_ADDR=" + s.HTTPAddr, "TALLY_DEV_SIM_ADDR=" + s.SimAddr,
			"TALLY_DEV_METRICS_ADDR=" + s.MetricsAddr,
			"TALLY_DEV_DB=" + s.DBName, "TALLY_DEV_KEY_FILE=" + s.KeyFile,
			"TALLY_ADMIN_DATABASE_URL=" + testdb.AdminURL(),
		},
		LogPath: s.LogPath,
		Ready:   "http://" + s.HTTPAddr + "/readyz",
	}
	require.NoError(t, stack.Start())
	t.Cleanup(func() { stack.Stop(15 * time.Second) })
	if err := stack.WaitReady(ctx, 3*time.Minute); err != nil {
		out, _ := os.ReadFile(s.LogPath)
		t.Fatalf("make run's stack did not come up: %v\n%s", err, out)
	}
	return s
}

// TestDevStackStripeWebhooks shows that the stack of `make run` wires the
// simulator's webhooks to the server: a refund and a dispute made in the
// simulator, as from Stripe's Dashboard, reach billing.refunds and
// billing.disputes, signed with the secret the server checks; and the
// server's metrics listen where TALLY_DEV_METRICS_ADDR says.
func TestDevStackStripeWebhooks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack")
	}
	ctx := context.Background()
	s := startDevStack(ctx, t)
	banner, err := os.ReadFile(s.LogPath)
	require.NoError(t, err)
	require.Contains(t, string(banner), "http://"+s.HTTPAddr+"/v1/stripe/webhooks", "the banner shows where the simulator's webhooks go")
	key, err := os.ReadFile(s.KeyFile)
	require.NoError(t, err)

	api := func(method, path, body string, want int, out any) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, "http://"+s.HTTPAddr+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(key)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, want, resp.StatusCode, "%s %s: %s", method, path, got)
		if out != nil {
			require.NoError(t, json.Unmarshal(got, out), "%s", got)
		}
	}

	// A charge, as in the quick start.
	api(http.MethodPut, "/v1/customers/refundco", `{"stripe_customer_id":"cus_refundco","currency":"usd"}`, http.StatusCreated, nil)
	var event struct {
		Period string `json:"period"`
	}
	api(http.MethodPost, "/v1/usage-events", `{"customer_id":"refundco","event_id":"e1","amount_cents":2000}`, http.StatusCreated, &event)
	api(http.MethodPost, "/v1/customers/refundco/periods/"+event.Period+"/close", "", http.StatusOK, nil)
	type charge struct {
		ID                    int64   `json:"id"`
		Status                string  `json:"status"`
		StripePaymentIntentID *string `json:"stripe_payment_intent_id"`
		StripeChargeID        *string `json:"stripe_charge_id"`
	}
	var charges struct {
		Data []charge `json:"data"`
	}
	if !eventually(ctx, time.Minute, func() bool {
		api(http.MethodGet, "/v1/charges?customer_id=refundco", "", http.StatusOK, &charges)
		return len(charges.Data) == 1 && charges.Data[0].Status == "succeeded"
	}) {
		t.Fatalf("the period's charge did not succeed: %+v", charges.Data)
	}
	c := charges.Data[0]
	require.NotNil(t, c.StripeChargeID)

	// A Dashboard refund of part of it, and a dispute, in the simulator.
	sim := &stripesim.ControlClient{BaseURL: "http://" + s.SimAddr}
	_, err = sim.ChargeRefund(ctx, *c.StripeChargeID, 500)
	require.NoError(t, err)
	dispute, err := sim.ChargeDispute(ctx, *c.StripeChargeID)
	require.NoError(t, err)

	db, err := pgx.Connect(ctx, s.DBURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	var refund struct {
		chargeID int64
		amount   int64
		status   string
	}
	var disputeCharge int64
	if !eventually(ctx, time.Minute, func() bool {
		err := db.QueryRow(ctx, `SELECT charge_id, amount_cents, status FROM billing.refunds_current WHERE stripe_charge_id = $1`,
			*c.StripeChargeID).Scan(&refund.chargeID, &refund.amount, &refund.status)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		err = db.QueryRow(ctx, `SELECT charge_id FROM billing.disputes_current WHERE stripe_dispute_id = $1`, dispute.ID).Scan(&disputeCharge)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return refund.status == "succeeded"
	}) {
		events, _ := sim.EventList(ctx)
		var delivery strings.Builder
		for _, e := range events {
			fmt.Fprintf(&delivery, "  %s %s: %d attempts, delivered %t %s\n", e.ID, e.Type, e.DeliveryAttempts, e.Delivered, e.LastDeliveryError)
		}
		out, _ := os.ReadFile(s.LogPath)
		t.Fatalf("the refund and the dispute did not reach the ledger; the simulator's events:\n%s\n%s", delivery.String(), out)
	}
	require.Equal(t, c.ID, refund.chargeID)
	require.Equal(t, int64(500), refund.amount)
	require.Equal(t, c.ID, disputeCharge)

	// The metrics, on TALLY_DEV_METRICS_ADDR.
	resp, err := http.Get("http://" + s.MetricsAddr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	metrics, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Regexp(t, `(?m)^tally_charge_transitions_total\{from="[a-z_]+",to="succeeded"\} 1$`, string(metrics))
}

// eventually polls cond until it holds or timeout passes, and reports
// whether it held.
func eventually(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}
