package bench

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Shapes of the closes phases (GitHub issue 25: a close with credits costs
// under 10% more than one without).
const (
	closesRounds = 3 // pairs of windows, one without credits, one with
	closesEvents = 3 // pre-priced events per customer, closesAmount each
	closesAmount = 1000
)

// closesGrants are the grants each customer of the credit side holds, in
// cents: together less than its period's total, so every charge keeps
// something to pay and both grants are applied.
var closesGrants = []int64{300, 400}

// closes measures closing periods through the API (POST
// /v1/customers/{id}/periods/{period}/close: the close's transaction,
// rating and, on one side, the burn-down of the customer's credits), for
// customers without credits (closes) and with two grants each
// (closes_credits), in closesRounds pairs of windows interleaved so both
// sides share the machine's moods; with --preload, a third window each
// round closes customers without credits on a clone of the preloaded
// ledger (closes_preloaded). Each window closes its own customers, Clients
// at a time; the servers run no worker, so the charges stay pending and
// nothing but the close is measured.
func (r *run) closes(ctx context.Context) error {
	return r.phases(step{PhaseClosesCredits, func() (*Result, error) { return r.closesRun(ctx) }})
}

// closesServer is a server of the closes phases, on a database of its own.
type closesServer struct {
	api   *apiClient
	dbURL string
	stop  func()
}

// closesStart starts a server for the closes phases on a fresh database
// (or a clone of the preloaded ledger), named after suffix.
func (r *run) closesStart(ctx context.Context, suffix string, preloaded bool) (*closesServer, error) {
	dbURL, key, err := r.tallyDatabase(ctx, suffix, preloaded)
	if err != nil {
		return nil, err
	}
	srv, err := r.startServer(ctx, suffix, dbURL, "TALLY_ROLES=api", "TALLY_PERIOD=hour", "TALLY_CLOSE_GRACE=4h")
	if err != nil {
		if preloaded {
			r.releaseDatabase(dbURL)
		}
		return nil, err
	}
	api := newAPIClient(srv.url, key, r.cfg.Clients)
	return &closesServer{api: api, dbURL: dbURL, stop: func() {
		api.close()
		srv.stop()
		if preloaded {
			r.releaseDatabase(dbURL) // as large as the ledger
		}
	}}, nil
}

func (r *run) closesRun(ctx context.Context) (*Result, error) {
	srv, err := r.closesStart(ctx, "closes", false)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	var pre *closesServer
	if r.cfg.runs(PhaseClosesPreloaded) {
		if pre, err = r.closesStart(ctx, "closes_pre", true); err != nil {
			return nil, err
		}
		defer pre.stop()
	}

	perWindow := r.cfg.Charges
	customers := customerIDs(2 * closesRounds * perWindow)
	window := func(round int, credits bool) []string {
		i := 2 * round * perWindow
		if credits {
			i += perWindow
		}
		return customers[i : i+perWindow]
	}
	var plain, granted []string // every round's customers without credits, and with
	for round := range closesRounds {
		plain = append(plain, window(round, false)...)
		granted = append(granted, window(round, true)...)
	}
	start := time.Now().UTC().Truncate(time.Hour)
	period := start.Format("2006-01-02T15")
	if err := r.closesSetup(ctx, srv.api, customers, granted, start); err != nil {
		return nil, &phaseError{phase: PhaseClosesCredits, err: err}
	}
	if pre != nil {
		// The same customers as the side without credits, on the
		// preloaded ledger.
		if err := r.closesSetup(ctx, pre.api, plain, nil, start); err != nil {
			return nil, &phaseError{phase: PhaseClosesPreloaded, err: err}
		}
	}
	names := []string{PhaseCloses, PhaseClosesCredits}
	if pre != nil {
		names = append(names, PhaseClosesPreloaded)
	}
	r.logf("%s: %d rounds of %d closes each, in turn: %s (%d grants each on %s)", PhaseClosesCredits, closesRounds,
		perWindow, strings.Join(names, ", "), len(closesGrants), PhaseClosesCredits)

	closeWindow := func(phase string, api *apiClient, ids []string) (loopResult, error) {
		lr := eachOnce(ctx, r.cfg.Clients, len(ids), setupTimeout, func(ctx context.Context, _, k int) (int, error) {
			return 1, api.do(ctx, http.MethodPost, "/v1/customers/"+ids[k]+"/periods/"+period+"/close", nil)
		})
		return lr, loopError(phase, lr)
	}
	var off, on, preOff []loopResult
	for round := range closesRounds {
		lr, err := closeWindow(PhaseCloses, srv.api, window(round, false))
		if err != nil {
			return nil, err
		}
		off = append(off, lr)
		if lr, err = closeWindow(PhaseClosesCredits, srv.api, window(round, true)); err != nil {
			return nil, err
		}
		on = append(on, lr)
		if pre == nil {
			continue
		}
		if lr, err = closeWindow(PhaseClosesPreloaded, pre.api, window(round, false)); err != nil {
			return nil, err
		}
		preOff = append(preOff, lr)
	}
	if err := closesVerify(ctx, srv.dbURL, len(customers), len(granted)); err != nil {
		return nil, &phaseError{phase: PhaseClosesCredits, err: err}
	}
	if pre != nil {
		if err := closesVerify(ctx, pre.dbURL, len(plain), 0); err != nil {
			return nil, &phaseError{phase: PhaseClosesPreloaded, err: err}
		}
	}
	result := func(phase string, lr loopResult, with string) *Result {
		return &Result{Phase: phase, Unit: "closes/s", Count: lr.units, Calls: lr.ops, Elapsed: lr.elapsed,
			Latency: newLatency(lr.latencies), Note: fmt.Sprintf(
				"%d clients closing periods of %d pre-priced events through the API, %s; %d windows of %d interleaved with %s",
				r.cfg.Clients, closesEvents, with, closesRounds, perWindow, strings.Join(names, ", "))}
	}
	r.pair(PhaseClosesCredits, PhaseCloses, on, off)
	if err := r.record(result(PhaseCloses, mergeLoops(off), "no credits"), nil); err != nil {
		return nil, err
	}
	if pre != nil {
		r.pair(PhaseClosesPreloaded, PhaseCloses, preOff, off)
		// Recorded before closes_credits, the step's own result: the
		// report lists the phases in Phases' order anyway.
		if err := r.record(result(PhaseClosesPreloaded, mergeLoops(preOff), "no credits, "+r.preloadedNote()), nil); err != nil {
			return nil, err
		}
	}
	return result(PhaseClosesCredits, mergeLoops(on), fmt.Sprintf("%d credit grants applied per close", len(closesGrants))), nil
}

// closesSetup puts the customers, their events (in the hour starting at
// start) and the grants of those granted.
func (r *run) closesSetup(ctx context.Context, api *apiClient, customers, granted []string, start time.Time) error {
	if err := r.putCustomers(ctx, api, customers, ""); err != nil {
		return err
	}
	at := start.Add(time.Second).Format(time.RFC3339)
	lr := eachOnce(ctx, r.cfg.Clients, len(customers), setupTimeout, func(ctx context.Context, _, k int) (int, error) {
		events := make([]event, closesEvents)
		for i := range events {
			events[i] = event{customer: customers[k], id: "close-" + strconv.Itoa(i), amount: closesAmount, occurredAt: at}
		}
		return 1, api.do(ctx, http.MethodPost, pathBatch, appendBatch(nil, events))
	})
	if lr.errors > 0 {
		return fmt.Errorf("error posting the closes' events (%d failed): %w", lr.errors, lr.firstErr)
	}
	if len(granted) == 0 {
		return r.checkpoint(ctx) // eachOnce of nothing would run until its timeout
	}
	lr = eachOnce(ctx, r.cfg.Clients, len(granted), setupTimeout, func(ctx context.Context, _, k int) (int, error) {
		for i, amount := range closesGrants {
			body := fmt.Sprintf(`{"grant_id":"g%d","amount_cents":%d,"currency":"usd","category":"paid"}`, i, amount)
			if err := api.do(ctx, http.MethodPost, "/v1/customers/"+granted[k]+"/credit-grants", []byte(body)); err != nil {
				return 0, err
			}
		}
		return 1, nil
	})
	if lr.errors > 0 {
		return fmt.Errorf("error granting credits (%d failed): %w", lr.errors, lr.firstErr)
	}
	return r.checkpoint(ctx)
}

// closesVerify checks that every period closed into one pending charge, n
// of them, and granted of them (the credit side's) less both grants, with a
// credit line for each.
func closesVerify(ctx context.Context, dbURL string, n, granted int) error {
	db, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer db.Close(context.WithoutCancel(ctx))
	var credits int64
	for _, g := range closesGrants {
		credits += g
	}
	full := int64(closesEvents * closesAmount)
	var charges, withCredits, right int
	err = db.QueryRow(ctx, `
SELECT count(*),
       count(*) FILTER (WHERE EXISTS (SELECT 1 FROM billing.charge_lines l WHERE l.charge_id = c.id AND l.kind = 'credit')),
       count(*) FILTER (WHERE c.status = 'pending' AND (c.amount_cents = $1 OR (c.amount_cents = $1 - $2
           AND (SELECT count(*) FROM billing.charge_lines l WHERE l.charge_id = c.id AND l.kind = 'credit') = $3)))
FROM billing.charges c`, full, credits, len(closesGrants)).Scan(&charges, &withCredits, &right)
	if err != nil {
		return fmt.Errorf("error reading the charges: %w", err)
	}
	if charges != n || withCredits != granted || right != n {
		return fmt.Errorf("want %d pending charges, %d of them %d less by %d credit lines; have %d charges, %d with credits, %d right",
			n, granted, credits, len(closesGrants), charges, withCredits, right)
	}
	return nil
}
