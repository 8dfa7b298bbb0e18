package bench

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
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
// sides share the machine's moods. Each window closes its own customers,
// Clients at a time; the server runs no worker, so the charges stay
// pending and nothing but the close is measured.
func (r *run) closes(ctx context.Context) error {
	return r.phases(step{PhaseClosesCredits, func() (*Result, error) { return r.closesRun(ctx) }})
}

func (r *run) closesRun(ctx context.Context) (*Result, error) {
	dbURL, key, err := r.tallyDatabase(ctx, "closes")
	if err != nil {
		return nil, err
	}
	srv, err := r.startServer(ctx, "closes", dbURL, "TALLY_ROLES=api", "TALLY_PERIOD=hour", "TALLY_CLOSE_GRACE=4h")
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	api := newAPIClient(srv.url, key, r.cfg.Clients)
	defer api.close()

	perWindow := r.cfg.Charges
	customers := customerIDs(2 * closesRounds * perWindow)
	window := func(round int, credits bool) []string {
		i := 2 * round * perWindow
		if credits {
			i += perWindow
		}
		return customers[i : i+perWindow]
	}
	start := time.Now().UTC().Truncate(time.Hour)
	period := start.Format("2006-01-02T15")
	if err := r.closesSetup(ctx, api, customers, start, window); err != nil {
		return nil, &phaseError{phase: PhaseClosesCredits, err: err}
	}
	r.logf("%s: %d rounds of %d closes without credits, then %d with %d grants each", PhaseClosesCredits, closesRounds,
		perWindow, perWindow, len(closesGrants))

	var off, on []loopResult
	for round := range closesRounds {
		for _, credits := range []bool{false, true} {
			ids := window(round, credits)
			lr := eachOnce(ctx, r.cfg.Clients, len(ids), setupTimeout, func(ctx context.Context, _, k int) (int, error) {
				return 1, api.do(ctx, http.MethodPost, "/v1/customers/"+ids[k]+"/periods/"+period+"/close", nil)
			})
			if err := loopError(PhaseClosesCredits, lr); err != nil {
				return nil, err
			}
			if credits {
				on = append(on, lr)
			} else {
				off = append(off, lr)
			}
		}
	}
	if err := closesVerify(ctx, dbURL, len(customers)); err != nil {
		return nil, &phaseError{phase: PhaseClosesCredits, err: err}
	}
	result := func(phase string, lr loopResult, with string) *Result {
		return &Result{Phase: phase, Unit: "closes/s", Count: lr.units, Calls: lr.ops, Elapsed: lr.elapsed,
			Latency: newLatency(lr.latencies), Note: fmt.Sprintf(
				"%d clients closing periods of %d pre-priced events through the API, %s; %d windows of %d interleaved with the other side",
				r.cfg.Clients, closesEvents, with, closesRounds, perWindow)}
	}
	r.pair(PhaseClosesCredits, PhaseCloses, on, off)
	if err := r.record(result(PhaseCloses, mergeLoops(off), "no credits"), nil); err != nil {
		return nil, err
	}
	return result(PhaseClosesCredits, mergeLoops(on), fmt.Sprintf("%d credit grants applied per close", len(closesGrants))), nil
}

// closesSetup puts the customers, their events (in the hour starting at
// start) and, for the credit side's windows, their grants.
func (r *run) closesSetup(ctx context.Context, api *apiClient, customers []string, start time.Time, window func(int, bool) []string) error {
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
	var granted []string
	for round := range closesRounds {
		granted = append(granted, window(round, true)...)
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

// closesVerify checks that every period closed into one pending charge, the
// credit side's less both grants, with a credit line for each.
func closesVerify(ctx context.Context, dbURL string, n int) error {
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
	if charges != n || withCredits != n/2 || right != n {
		return fmt.Errorf("want %d pending charges, half of them %d less by %d credit lines; have %d charges, %d with credits, %d right",
			n, credits, len(closesGrants), charges, withCredits, right)
	}
	return nil
}
