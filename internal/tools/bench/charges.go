package bench

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/proc"
)

// Shapes and bounds of the charges phase.
const (
	chargesBatch     = 100                    // events per batch when posting the phase's events
	chargesPollEvery = 250 * time.Millisecond // how often billing.charges is read after the close; the times come from the rows, so polling less often loses no precision and takes less CPU from what is measured
	// chargeAmountBase keeps every charge above Stripe's minimum (50 cents),
	// so none is carried forward.
	chargeAmountBase = 1000
)

// charges is the charges phase. On a fresh database it creates Charges
// customers through a first API server, then starts a server with
// TALLY_ROLES=api,worker and TALLY_PERIOD=hour against the Stripe simulator,
// with a close grace computed from the clock so that the previous hour's
// periods close a few seconds after their events are in: one event per
// customer, posted with occurred_at in the previous hour. It measures from that close
// moment until the last charge succeeded, and checks that exactly Charges
// charges succeeded, and that the simulator holds exactly that many
// succeeded PaymentIntents.
func (r *run) charges(ctx context.Context) error {
	baseURL, err := r.baseDatabase(ctx)
	if err != nil {
		return err
	}
	r.logf("%s, %s: %d rounds, %d jobs or charges each", PhaseRiverNoop, PhaseCharges, r.rounds(), r.cfg.Charges)
	var noop, charges, pooled, preloaded []*Result
	for round := range r.rounds() {
		if err := r.checkpoint(ctx); err != nil {
			return err
		}
		res, err := r.riverNoop(ctx, baseURL)
		if err != nil {
			return r.record(res, err)
		}
		noop = append(noop, res)
		if !r.cfg.runs(PhaseCharges) {
			continue
		}
		if err := r.checkpoint(ctx); err != nil {
			return err
		}
		if res, err = r.chargesRun(ctx, round, PhaseCharges); err != nil {
			return r.record(res, err)
		}
		charges = append(charges, res)
		for _, v := range []struct {
			phase   string
			results *[]*Result
		}{{PhaseChargesPooled, &pooled}, {PhaseChargesPreloaded, &preloaded}} {
			if !r.cfg.runs(v.phase) {
				continue
			}
			if err := r.checkpoint(ctx); err != nil {
				return err
			}
			if res, err = r.chargesRun(ctx, round, v.phase); err != nil {
				return r.record(res, err)
			}
			*v.results = append(*v.results, res)
		}
	}
	note := fmt.Sprintf("; %d rounds alternating %s and %s", r.rounds(), PhaseRiverNoop, PhaseCharges)
	if err := r.record(mergeResults(noop, note), nil); err != nil {
		return err
	}
	if len(charges) == 0 {
		return nil
	}
	if err := r.record(mergeResults(charges, note), nil); err != nil {
		return err
	}
	ratios := make([]float64, len(charges))
	for i := range charges {
		ratios[i] = charges[i].Rate() / noop[i].Rate()
	}
	r.pairRatios(PhaseCharges, PhaseRiverNoop, ratios)
	// The variants, each paired with charges round by round.
	variants := []struct {
		phase   string
		results []*Result
	}{{PhaseChargesPooled, pooled}, {PhaseChargesPreloaded, preloaded}}
	alternating := []string{PhaseRiverNoop, PhaseCharges}
	for _, v := range variants {
		if len(v.results) > 0 {
			alternating = append(alternating, v.phase)
		}
	}
	for _, v := range variants {
		if len(v.results) == 0 {
			continue
		}
		if err := r.record(mergeResults(v.results, fmt.Sprintf("; %d rounds alternating %s", r.rounds(),
			strings.Join(alternating, ", "))), nil); err != nil {
			return err
		}
		ratios := make([]float64, len(v.results))
		for i := range v.results {
			ratios[i] = v.results[i].Rate() / charges[i].Rate()
		}
		r.pairRatios(v.phase, PhaseCharges, ratios)
	}
	return nil
}

// mergeResults adds up results of one phase measured in several windows;
// the note is the last one's, with more appended.
func mergeResults(results []*Result, more string) *Result {
	m := *results[len(results)-1]
	m.Count, m.Calls, m.Elapsed = 0, 0, 0
	for _, res := range results {
		m.Count += res.Count
		m.Calls += res.Calls
		m.Elapsed += res.Elapsed
	}
	m.Note += more
	return &m
}

// chargesRun measures one round of phase: charges, charges_pgbouncer (the
// servers' pools through PgBouncer) or charges_preloaded (on a clone of the
// preloaded ledger, dropped at the end).
func (r *run) chargesRun(ctx context.Context, round int, phase string) (*Result, error) {
	n := r.cfg.Charges
	throughPooler, preloaded := phase == PhaseChargesPooled, phase == PhaseChargesPreloaded
	suffix := ""
	switch {
	case throughPooler:
		suffix = "p"
	case preloaded:
		suffix = "_pre"
	}
	dbURL, key, err := r.tallyDatabase(ctx, "charges"+strconv.Itoa(round)+suffix, preloaded)
	if err != nil {
		return nil, err
	}
	if preloaded {
		defer r.releaseDatabase(dbURL) // after the servers stop
	}
	// The servers that close and charge: their pools through PgBouncer
	// for charges_pgbouncer (River's own pool stays direct).
	serverEnv := []string{"TALLY_ROLES=api,worker", "TALLY_PERIOD=hour", "STRIPE_API_KEY=sk_test_bench"}
	if throughPooler {
		poolerURL, err := r.poolerURL(ctx, dbURL)
		if err != nil {
			return nil, err
		}
		serverEnv = append(serverEnv, "TALLY_POOLER_URL="+poolerURL)
	}
	sim, simURL, err := r.startSimulator(ctx)
	if err != nil {
		return nil, err
	}
	defer sim.Stop(serverStopWait)

	// The customers, through a server whose grace does not matter: only the
	// server that creates the periods fixes their close time.
	customers := customerIDs(n)
	t0 := time.Now()
	setup, err := r.startServer(ctx, fmt.Sprintf("api-charges-setup-%d", round), dbURL, "TALLY_ROLES=api")
	if err != nil {
		return nil, err
	}
	startup := time.Since(t0)
	api := newAPIClient(setup.url, key, r.cfg.Clients)
	t1 := time.Now()
	err = r.putCustomers(ctx, api, customers, "")
	put := time.Since(t1) // how busy the machine is: posting the events takes about as long
	api.close()
	setup.stop()
	if err != nil {
		return nil, err
	}

	// The close moment: far enough ahead for a server start and the events,
	// with a margin; periods of the previous hour end at prevEnd and close
	// at prevEnd + grace.
	now := time.Now()
	prevEnd := now.UTC().Truncate(time.Hour)
	// A short run is make test's, beside every other package's tests:
	// 50 events once took 4.5 s there, so it waits longer for the close
	// (the time to the close is not measured).
	margin := 5 * time.Second
	if r.cfg.Short {
		margin = 20 * time.Second
	}
	budget := 2*startup + 2*put + margin + time.Duration(n)*6*time.Millisecond
	grace := now.Add(budget).Sub(prevEnd).Round(time.Millisecond)
	closeAt := prevEnd.Add(grace)
	r.logf("%s: periods of %s close at %s (grace %s)", phase, prevEnd.Add(-time.Hour).Format("2006-01-02T15"),
		closeAt.Format("15:04:05.000"), grace)
	serverEnv = append(serverEnv, "TALLY_CLOSE_GRACE="+grace.String(), "STRIPE_API_BASE="+simURL)
	srv, err := r.startServer(ctx, fmt.Sprintf("%s-%d", phase, round), dbURL, serverEnv...)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	for i := 1; i < r.cfg.WorkerReplicas; i++ {
		// api,worker so that /readyz answers; nothing posts to its API.
		w, err := r.startServer(ctx, fmt.Sprintf("%s-%d-%d", phase, round, i+1), dbURL, serverEnv...)
		if err != nil {
			return nil, err
		}
		defer w.stop()
	}

	if err := r.postChargeEvents(ctx, srv.url, key, customers, prevEnd.Add(-30*time.Minute), closeAt); err != nil {
		return nil, err
	}
	r.logf("%s: %d events in, %s before the close", phase, n, time.Until(closeAt).Round(time.Millisecond))
	select {
	case <-time.After(time.Until(closeAt)):
	case <-ctx.Done():
		return nil, ctx.Err()
	}

	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("error connecting to the charges database: %w", err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	st, err := waitCharges(ctx, db, n, 5*time.Minute+time.Duration(n)*100*time.Millisecond)
	if err != nil {
		return nil, err
	}
	elapsed := st.lastSucceeded.Sub(closeAt)
	res := &Result{Phase: phase, Unit: "charges/s", Count: int64(n), Elapsed: elapsed,
		Note: fmt.Sprintf("%d worker replica(s) × %d workers; from the close: first charge row at +%s, last success at +%s",
			r.cfg.WorkerReplicas, r.cfg.Workers, st.firstCreated.Sub(closeAt).Round(time.Millisecond), elapsed.Round(time.Millisecond))}
	if preloaded {
		res.Note += "; " + r.preloadedNote()
	}
	if err := verifyCharges(ctx, simURL, n, st); err != nil {
		return res, &phaseError{phase: phase, err: err}
	}
	return res, nil
}

// startSimulator starts cmd/stripesim (no latency, no faults, no webhooks)
// on a free port and returns it with its base URL.
func (r *run) startSimulator(ctx context.Context) (*proc.Proc, string, error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, "", fmt.Errorf("error finding a free port for stripesim: %w", err)
	}
	simURL := fmt.Sprintf("http://127.0.0.1:%d", port)
	sim := &proc.Proc{Name: "stripesim", Bin: filepath.Join(r.binDir, "stripesim"),
		Args:    []string{"--addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn"},
		LogPath: filepath.Join(r.logDir, "stripesim.log"), Ready: simURL + "/_sim/health"}
	if err := sim.Start(); err != nil {
		return nil, "", err
	}
	if err := sim.WaitReady(ctx, readyTimeout); err != nil {
		sim.Stop(serverStopWait)
		return nil, "", err
	}
	return sim, simURL, nil
}

// postChargeEvents posts one event per customer, occurred at occurredAt, in
// batches of chargesBatch from loadClients clients, and fails when they are
// not all in before closeAt.
func (r *run) postChargeEvents(ctx context.Context, serverURL, key string, customers []string, occurredAt, closeAt time.Time) error {
	api := newAPIClient(serverURL, key, loadClients)
	defer api.close()
	n := len(customers)
	at := occurredAt.UTC().Format(time.RFC3339)
	lr := eachOnce(ctx, loadClients, (n+chargesBatch-1)/chargesBatch, setupTimeout, func(ctx context.Context, _, k int) (int, error) {
		events := make([]event, 0, chargesBatch)
		for i := k * chargesBatch; i < min(n, (k+1)*chargesBatch); i++ {
			events = append(events, event{customer: customers[i], id: "charge-1", amount: int64(chargeAmountBase + i), occurredAt: at})
		}
		return len(events), api.do(ctx, http.MethodPost, pathBatch, appendBatch(nil, events))
	})
	if err := loopError(PhaseCharges, lr); err != nil {
		return err
	}
	if lr.units != int64(n) {
		return &phaseError{phase: PhaseCharges, err: fmt.Errorf("posted %d of %d events", lr.units, n)}
	}
	if late := time.Since(closeAt); late > -100*time.Millisecond {
		return &phaseError{phase: PhaseCharges, err: fmt.Errorf(
			"the events took %s and were not all in before the close moment (%s after it): nothing would be measured",
			lr.elapsed.Round(time.Millisecond), late.Round(time.Millisecond))}
	}
	return nil
}

// chargeState is what billing.charges holds once every charge succeeded.
type chargeState struct {
	byStatus      map[string]int
	firstCreated  time.Time // the first charge row
	lastSucceeded time.Time // updated_at of the last charge to succeed
}

// waitCharges polls billing.charges until n charges succeeded, and fails
// when one is held or ends otherwise, or after timeout.
func waitCharges(ctx context.Context, db *pgx.Conn, n int, timeout time.Duration) (chargeState, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := readCharges(ctx, db)
		if err != nil {
			return st, err
		}
		if st.byStatus[string(ledger.ChargeSucceeded)] >= n {
			return st, nil
		}
		for s, c := range st.byStatus {
			if cs := ledger.ChargeStatus(s); cs == ledger.ChargeHeld || (cs.Terminal() && cs != ledger.ChargeSucceeded) {
				return st, &phaseError{phase: PhaseCharges, err: fmt.Errorf("%d charge(s) %s: %s", c, s, formatStatuses(st.byStatus))}
			}
		}
		if time.Now().After(deadline) {
			return st, &phaseError{phase: PhaseCharges, err: fmt.Errorf("not every charge succeeded within %s: %s", timeout, formatStatuses(st.byStatus))}
		}
		select {
		case <-time.After(chargesPollEvery):
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
}

// readCharges counts the charges by status, with the first creation and
// the last success.
func readCharges(ctx context.Context, db *pgx.Conn) (chargeState, error) {
	st := chargeState{byStatus: map[string]int{}}
	rows, err := db.Query(ctx, `
SELECT status, count(*), min(created_at), max(updated_at) FROM billing.charges GROUP BY status`)
	if err != nil {
		return st, fmt.Errorf("error reading charges: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var status string
		var count int
		var created, updated pgtype.Timestamptz
		if err := rows.Scan(&status, &count, &created, &updated); err != nil {
			return st, fmt.Errorf("error reading charges: %w", err)
		}
		st.byStatus[status] = count
		if st.firstCreated.IsZero() || created.Time.Before(st.firstCreated) {
			st.firstCreated = created.Time
		}
		if status == string(ledger.ChargeSucceeded) {
			st.lastSucceeded = updated.Time
		}
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("error reading charges: %w", err)
	}
	return st, nil
}

// verifyCharges checks that exactly n charges exist, all succeeded, and
// that the simulator holds exactly n PaymentIntents, all succeeded.
func verifyCharges(ctx context.Context, simURL string, n int, st chargeState) error {
	total := 0
	for _, c := range st.byStatus {
		total += c
	}
	if total != n || st.byStatus[string(ledger.ChargeSucceeded)] != n {
		return fmt.Errorf("want exactly %d charges, all succeeded; have %s", n, formatStatuses(st.byStatus))
	}
	pis, err := (&stripesim.ControlClient{BaseURL: simURL}).PaymentIntentList(ctx)
	if err != nil {
		return fmt.Errorf("error listing the simulator's PaymentIntents: %w", err)
	}
	succeeded := 0
	for _, pi := range pis {
		if pi.Status == "succeeded" {
			succeeded++
		}
	}
	if len(pis) != n || succeeded != n {
		return fmt.Errorf("want exactly %d PaymentIntents on the simulator, all succeeded; have %d, %d succeeded", n, len(pis), succeeded)
	}
	return nil
}

// formatStatuses formats counts by status, sorted: "pending 3, succeeded 997".
func formatStatuses(m map[string]int) string {
	if len(m) == 0 {
		return "no charges"
	}
	parts := make([]string, 0, len(m))
	for s, c := range m {
		parts = append(parts, fmt.Sprintf("%s %d", s, c))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
