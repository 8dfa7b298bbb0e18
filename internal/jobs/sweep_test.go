package jobs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/ledger"
)

// logBuffer keeps a logger's JSON lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// records returns every record whose msg starts with prefix.
func (l *logBuffer) records(t *testing.T, prefix string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if msg, _ := rec["msg"].(string); strings.HasPrefix(msg, prefix) {
			out = append(out, rec)
		}
	}
	return out
}

// waitRecord waits for a record whose msg starts with prefix and returns it.
func (l *logBuffer) waitRecord(t *testing.T, prefix string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		if recs := l.records(t, prefix); len(recs) > 0 {
			return recs[0]
		}
		require.True(t, time.Now().Before(deadline), "no log record %q", prefix)
		time.Sleep(50 * time.Millisecond)
	}
}

// sweepWorkerOpts tweak startSweepWorker.
type sweepWorkerOpts struct {
	stuckAttempts int
}

// startSweepWorker stops the bundle's worker and starts one that sweeps
// every 200 ms (on the ledger's clock, with the default grace), logging its
// warnings as JSON into the returned buffer.
func (b *testBundle) startSweepWorker(t *testing.T, ctx context.Context, opts sweepWorkerOpts) *logBuffer {
	t.Helper()
	_ = b.worker.Stop(ctx)
	logs := &logBuffer{}
	logger := slog.New(slog.NewJSONHandler(io.MultiWriter(logs, testLog{t}), &slog.HandlerOptions{Level: slog.LevelWarn}))
	client, err := jobs.NewWorkerClient(b.Pool, jobs.WorkerConfig{
		Ledger: b.Ledger, Stripe: b.stripe, StripeTimeout: b.stripeTimeout, Concurrency: 10,
		Logger: logger, RetryPolicy: fastRetry{},
		SweepInterval: 200 * time.Millisecond, StripeEventStuckAttempts: opts.stuckAttempts,
	})
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	})
	b.worker = client
	return logs
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// novemberClosesAt is when the November 2026 period closes: month end plus
// the default 1 h grace.
var novemberClosesAt = time.Date(2026, 12, 1, 1, 0, 0, 0, time.UTC)

func TestSweepPeriodJobLost(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name  string
		state string // River's state of the lost job
		lose  func(t *testing.T, ctx context.Context, b *testBundle, jobID int64)
	}{
		{"Cancelled", "cancelled", func(t *testing.T, ctx context.Context, b *testBundle, jobID int64) {
			_, err := b.River.JobCancel(ctx, jobID)
			require.NoError(t, err)
		}},
		{"DeletedByRetention", ledger.JobStateDeleted, func(t *testing.T, ctx context.Context, b *testBundle, jobID int64) {
			_, err := b.River.JobDelete(ctx, jobID)
			require.NoError(t, err)
		}},
		{"DiscardedAfterRetries", "discarded", func(t *testing.T, ctx context.Context, b *testBundle, jobID int64) {
			_, err := b.Pool.Exec(ctx, `
UPDATE river.river_job SET state = 'discarded', attempt = max_attempts, finalized_at = now() WHERE id = $1`, jobID)
			require.NoError(t, err)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, b := setup(t, setupOpts{})
			require.NoError(t, b.worker.Stop(ctx)) // no worker while the job is lost
			b.customerWithEvents(t, ctx, "acme", 300, 200)
			p, err := b.Ledger.PeriodGet(ctx, "acme", "2026-11")
			require.NoError(t, err)
			tt.lose(t, ctx, b, *p.ChargeJobID)
			b.Clock.Set(novemberClosesAt.Add(jobs.SweepAfterDefault + time.Minute))

			logs := b.startSweepWorker(t, ctx, sweepWorkerOpts{})
			c := b.waitCharge(t, ctx, "acme", statusIs(ledger.ChargeSucceeded))
			require.Equal(t, int64(500), c.AmountCents)
			require.Equal(t, []string{*c.StripePaymentIntentID}, b.paymentIntents("cus_acme"), "charged exactly once")

			alert := logs.waitRecord(t, "ALERT period open past its close")
			require.Equal(t, "ERROR", alert["level"])
			require.Equal(t, "period_job_lost", alert["alert"])
			require.Equal(t, "acme", alert["customer_id"])
			require.Equal(t, "2026-11", alert["period"])
			require.Equal(t, novemberClosesAt.Format(time.RFC3339), alert["closes_at"])
			require.Equal(t, tt.state, alert["job_state"])
			require.Equal(t, "charge_job_run_now", alert["action"])
			require.EqualValues(t, *p.ChargeJobID, alert["job_id"])
			b.waitJobsFinalized(t)
			require.Len(t, logs.records(t, "ALERT period open past its close"), 1, "a job that runs again is not lost")
		})
	}
}

func TestSweepStripeEvent(t *testing.T) {
	t.Parallel()

	t.Run("KeepsFailingAlerts", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		require.NoError(t, b.worker.Stop(ctx))
		url := b.apiServer(t)
		// A payload Tally cannot decode: every attempt fails.
		ev := piEvent("evt_poison", "payment_intent.succeeded", "pi_x", "succeeded", "k")
		ev["data"].(map[string]any)["object"].(map[string]any)["amount"] = "a lot"
		status, _ := b.webhookPost(t, url, ev, webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		stored, err := b.Ledger.StripeEventGet(ctx, "evt_poison")
		require.NoError(t, err)
		// River gives up after two attempts instead of 25.
		_, err = b.Pool.Exec(ctx, `UPDATE river.river_job SET max_attempts = 2 WHERE id = $1`, *stored.JobID)
		require.NoError(t, err)
		b.Clock.Advance(jobs.SweepAfterDefault + time.Minute)

		logs := b.startSweepWorker(t, ctx, sweepWorkerOpts{stuckAttempts: 2})
		alert := logs.waitRecord(t, "ALERT stripe event not processed")
		require.Equal(t, "ERROR", alert["level"])
		require.Equal(t, "stripe_event_stuck", alert["alert"])
		require.Equal(t, "evt_poison", alert["event_id"])
		require.Equal(t, "payment_intent.succeeded", alert["type"])
		require.Equal(t, ledger.StripeEventFailed, alert["status"])
		require.GreaterOrEqual(t, alert["attempts"], float64(2))
		require.Contains(t, alert["last_error"], "error decoding PaymentIntent")

		// Discarded after its attempts, the job is run again by the sweep.
		rerun := func() map[string]any {
			for _, rec := range append(logs.records(t, "ALERT stripe event not processed"), logs.records(t, "stripe event's job was gone")...) {
				if rec["event_id"] == "evt_poison" && rec["action"] == "job_run_again" {
					return rec
				}
			}
			return nil
		}
		deadline := time.Now().Add(waitTimeout)
		for rerun() == nil || b.Count(t, `SELECT attempt FROM river.river_job WHERE id = $1`, *stored.JobID) < 3 {
			require.True(t, time.Now().Before(deadline), "the discarded job never ran again")
			time.Sleep(50 * time.Millisecond)
		}
		require.Equal(t, "discarded", rerun()["job_state"])
		require.Len(t, logs.records(t, "ALERT stripe event not processed"), 1, "reported once an hour (on the ledger's clock)")
	})

	t.Run("LostJobRunsAgain", func(t *testing.T) {
		t.Parallel()
		ctx, b := setup(t, setupOpts{})
		require.NoError(t, b.worker.Stop(ctx))
		url := b.apiServer(t)
		ev := map[string]any{"id": "evt_lost", "object": "event", "type": "customer.created", "created": time.Now().Unix(),
			"data": map[string]any{"object": map[string]any{"id": "cus_1", "object": "customer"}}}
		status, _ := b.webhookPost(t, url, ev, webhookSecret, time.Time{})
		require.Equal(t, http.StatusOK, status)
		stored, err := b.Ledger.StripeEventGet(ctx, "evt_lost")
		require.NoError(t, err)
		_, err = b.River.JobCancel(ctx, *stored.JobID)
		require.NoError(t, err)
		b.Clock.Advance(jobs.SweepAfterDefault + time.Minute)

		logs := b.startSweepWorker(t, ctx, sweepWorkerOpts{})
		b.waitEvent(t, ctx, "evt_lost", ledger.StripeEventIgnored)
		rec := logs.waitRecord(t, "stripe event's job was gone")
		require.Equal(t, "WARN", rec["level"])
		require.Equal(t, "evt_lost", rec["event_id"])
		require.Equal(t, "cancelled", rec["job_state"])
		require.Equal(t, "job_run_again", rec["action"])
		require.Empty(t, logs.records(t, "ALERT"), "a lost job found in time is not an alert")
	})
}
