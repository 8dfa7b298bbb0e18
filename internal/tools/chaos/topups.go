package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/proc"
)

// Top-ups (issue 25): besides their grants, a third of the prepaid
// customers buy credits through the API during the run (planTopUps), and a
// third have an automatic recharge (rechargeTerms), which the closes start.
// Which customers, how many top-ups, their amounts, when they are posted
// and the Stripe fault each meets all follow from the seed. The explicit
// top-ups are posted as a careful client would: the same top_up_id again
// after a timeout (some first attempts give up after a few milliseconds,
// whatever the server did), a duplicate at once to the other
// replica, a replay after the answer, and a conflicting re-post (another
// amount) that must be refused. The check (checkTopUps) holds every top-up
// to Stripe's record: bought at most once, one grant per success, none
// otherwise, and each recharge once per crossing of its threshold.

// prepaidRole is what a prepaid customer does besides holding its grants.
type prepaidRole int

const (
	roleGrantsOnly prepaidRole = iota
	roleTopUps                 // buys top-ups through the API
	roleRecharge               // has an automatic recharge
)

// prepaidRoleOf is the role of the rank-th prepaid customer (customer i),
// turning with the seed so every role is taken. A customer with an expiring
// grant does not recharge: its balance would fall without a close, and the
// check's "a close below the threshold starts a recharge" reads the balance
// after the last close.
func prepaidRoleOf(seed int64, rank, i int) prepaidRole {
	role := prepaidRole((int64(rank) + seed%3 + 3) % 3)
	if role == roleRecharge && expiringGrant(i) {
		role = roleTopUps
	}
	return role
}

// expiringGrant reports whether customer i's grants include g-expiring.
func expiringGrant(i int) bool { return i%30 == 3 }

// grantsTotal is what customer i's grants (creditGrants) add up to.
func grantsTotal(i int) int64 {
	var total int64
	for _, g := range creditGrants(i, time.Time{}) {
		total += int64(g["amount_cents"].(int))
	}
	return total
}

// rechargeTerms are customer i's recharge_below_cents and
// recharge_to_cents: for most, above what its grants hold, so the first
// close starts a recharge; for one in three (i%3 == 0), below it, so only
// a close that burns the grants down (the last period's) does. The target
// is at least 1,500 above the threshold, so a recharge is never raised to
// Stripe's minimum.
func rechargeTerms(i int) (below, to int64) {
	below = grantsTotal(i) + 500 + int64(i%7)*100
	if i%3 == 0 {
		below = 100 + int64(i%5)*50
	}
	return below, below + 1500 + int64(i%5)*300
}

// customerBody is PUT /v1/customers/{id}'s body for customer i: the whole
// customer, as a PUT replaces every field (a re-PUT without the recharge
// fields would turn the recharge off).
func customerBody(i int, recharge bool) map[string]any {
	body := map[string]any{"stripe_customer_id": stripeCustomerID(i), "currency": "usd"}
	if planCustomer(i) {
		body["plan_id"] = chaosPlanID
	}
	if recharge {
		body["recharge_below_cents"], body["recharge_to_cents"] = rechargeTerms(i)
	}
	return body
}

func stripeCustomerID(i int) string { return fmt.Sprintf("cus_chaos_%04d", i) }

// plannedTopUp is one top-up the run buys through the API.
type plannedTopUp struct {
	customer  int
	id        string // customer id
	topUpID   string
	amount    int64
	at        float64             // share of the work after which it is posted
	fault     stripesim.FaultKind // set for the customer just before the post ("" none)
	giveUpMS  int                 // > 0: the first attempt gives up after this many ms
	duplicate bool                // the same post at once to the other replica
	conflict  bool                // after the answer, the same top_up_id with another amount
	replica   int                 // preferred API replica
}

// topUpFaults are the Stripe faults a planned top-up may meet, set for its
// customer (Count 1) just before it is posted: "" is none.
var topUpFaults = []stripesim.FaultKind{"", "", "", stripesim.FaultKindDecline, stripesim.FaultKindError500BeforeCreate,
	stripesim.FaultKindError500AfterCreate, stripesim.FaultKindDropAfterCreate, stripesim.FaultKindLatency}

// The webhook outage: from webhookOutageFrom to webhookOutageTo of the
// work the simulator's webhooks go to a closed port (each given up after
// its few retries: lost). Only top-ups call Stripe then (no period has
// closed yet), and half of those posted then meet a 500 after their
// PaymentIntent was created: with no webhook to say it succeeded, only
// the job's look-up before its next call keeps it from buying twice once
// the key window has passed.
const (
	webhookOutageFrom = 0.08
	webhookOutageTo   = 0.30
)

// webhookMode is the simulator's webhook mode of the run: to the first API
// replica, each event twice, delayed and reordered.
func (r *run) webhookMode() stripesim.WebhookMode {
	return stripesim.WebhookMode{URL: r.apiURLs[0] + "/v1/stripe/webhooks", Duplicate: 1, Delay: 200 * time.Millisecond, Reorder: true}
}

// webhooksDown starts the webhook outage: the simulator delivers to a
// loopback port nothing listens on.
func (r *run) webhooksDown(ctx context.Context) {
	port, err := proc.FreePort()
	if err != nil {
		r.logf("webhook outage: %v", err)
		return
	}
	mode := r.webhookMode()
	mode.URL = fmt.Sprintf("http://127.0.0.1:%d/v1/stripe/webhooks", port)
	if _, err := r.control.WebhookModeSet(context.WithoutCancel(ctx), mode); err != nil {
		r.logf("webhook outage: %v", err)
		return
	}
	r.logf("webhooks down (to %s)", mode.URL)
	r.fault("webhook outage")
}

// webhooksUp ends the webhook outage; a no-op when there is none.
func (r *run) webhooksUp(ctx context.Context) {
	if _, err := r.control.WebhookModeSet(context.WithoutCancel(ctx), r.webhookMode()); err != nil {
		r.logf("webhooks up: %v", err)
	}
}

// rechargeFaults sets, just before the first period's closes, a stored 500
// (error_500_before_create, twice: the customer's charge may take one) for
// every recharge customer: its first recharge stays unknown for the key
// window, while the run puts the customer again and closes its next
// period, neither of which may start a second recharge.
func (r *run) rechargeFaults(ctx context.Context) {
	for _, i := range r.rechargers {
		f := stripesim.Fault{Customer: stripeCustomerID(i), Kind: stripesim.FaultKindError500BeforeCreate, Count: 2}
		if err := r.control.FaultAdd(context.WithoutCancel(ctx), f); err != nil {
			r.logf("recharge fault: %v", err)
			continue
		}
		r.fault("recharge customer stripe error_500_before_create")
	}
}

// planTopUps plans the explicit top-ups of the customers given (indexes
// into ids), deterministic in rnd: three to five each, posted between 3%
// and 90% of the work, a few at Stripe's minimum; half of them first sent
// by a client that gives up after a few milliseconds (before the answer,
// often after the commit), half with a duplicate at once.
func planTopUps(rnd *rand.Rand, buyers []int, ids []string) []*plannedTopUp {
	var out []*plannedTopUp
	for _, c := range buyers {
		for k := range 3 + rnd.IntN(3) {
			t := &plannedTopUp{customer: c, id: ids[c], topUpID: fmt.Sprintf("tu-%d", k+1),
				amount: int64(usdMinimum + rnd.IntN(3000)), at: 0.03 + 0.87*rnd.Float64(),
				fault: topUpFaults[rnd.IntN(len(topUpFaults))], replica: rnd.IntN(2)}
			if t.at >= webhookOutageFrom && t.at < webhookOutageTo && rnd.IntN(2) == 0 {
				t.fault = stripesim.FaultKindError500AfterCreate
			}
			if rnd.IntN(6) == 0 {
				t.amount = usdMinimum
			}
			if rnd.IntN(2) == 0 {
				t.giveUpMS = 1 + rnd.IntN(8)
			}
			t.duplicate = rnd.IntN(2) == 0
			t.conflict = rnd.IntN(4) == 0
			out = append(out, t)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// topUpBook is what the run asked for and what it was answered.
type topUpBook struct {
	mu      sync.Mutex
	planned map[string]*plannedTopUp // customer/top_up_id → the top-up
	acked   map[string]bool          // answered 2xx
	created map[string]int           // 201 answers (at most one may create it)
	// odd lists answers a client must never get: a replay after a 2xx that
	// is not 200, a conflicting re-post that is not refused with 409
	// top_up_id_reused.
	odd []string
}

func newTopUpBook() *topUpBook {
	return &topUpBook{planned: map[string]*plannedTopUp{}, acked: map[string]bool{}, created: map[string]int{}}
}

func (b *topUpBook) answer(k string, status int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if status == http.StatusCreated {
		b.created[k]++
	}
	if status/100 == 2 {
		b.acked[k] = true
	}
}

func (b *topUpBook) oddf(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.odd = append(b.odd, fmt.Sprintf(format, args...))
}

// topUpLoop posts the planned top-ups as the work reaches each one's
// share, each in its own goroutine, and waits for them all.
func (r *run) topUpLoop(ctx context.Context, planned []*plannedTopUp) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, t := range planned {
		for float64(r.workDone.Load()) < t.at*float64(r.workTotal) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); r.buyTopUp(context.WithoutCancel(ctx), t) }()
	}
}

// buyTopUp posts one planned top-up: its fault first, then the post
// (a first attempt that may give up early, a duplicate at once, the
// producer's retries with the same top_up_id), then a replay, and a
// conflicting re-post when planned.
func (r *run) buyTopUp(ctx context.Context, t *plannedTopUp) {
	k := t.id + "/" + t.topUpID
	path := "/v1/customers/" + t.id + "/top-ups"
	body := map[string]any{"top_up_id": t.topUpID, "amount_cents": t.amount}
	if t.fault != "" {
		f := stripesim.Fault{Customer: stripeCustomerID(t.customer), Kind: t.fault, Count: 1}
		if f.Kind == stripesim.FaultKindLatency {
			f.Latency = stripeLatency
		}
		if err := r.control.FaultAdd(ctx, f); err != nil {
			r.logf("top-up fault %s: %v", t.fault, err)
		} else {
			r.fault("top-up stripe " + string(t.fault))
		}
	}
	if t.giveUpMS > 0 {
		// A client that gives up quickly: the server may or may not have
		// committed the top-up; the retries below must find one, not make two.
		status, err := r.postOnce(ctx, path, t.replica, body, time.Duration(t.giveUpMS)*time.Millisecond)
		if err != nil {
			r.fault("top-up first attempt given up")
		} else {
			r.topUps.answer(k, status)
		}
	}
	var wg sync.WaitGroup
	if t.duplicate {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ans, err := r.producer.do(ctx, http.MethodPost, path, 1-t.replica, body); err == nil {
				r.topUps.answer(k, ans.status)
			}
			r.fault("top-up duplicate")
		}()
	}
	ans, err := r.producer.do(ctx, http.MethodPost, path, t.replica, body)
	wg.Wait()
	switch {
	case err != nil:
		r.logf("top-up %s: gave up: %v", k, err)
		return
	case ans.status/100 != 2:
		r.topUps.oddf("top-up %s of %d answered %d %s", k, t.amount, ans.status, ans.code)
		return
	}
	r.topUps.answer(k, ans.status)
	r.fault("top-up bought")

	// A replay after the answer is that same top-up, 200.
	if ans, err := r.producer.do(ctx, http.MethodPost, path, 1-t.replica, body); err == nil {
		r.topUps.answer(k, ans.status)
		if ans.status != http.StatusOK {
			r.topUps.oddf("top-up %s replayed after its 2xx: answered %d %s, want 200", k, ans.status, ans.code)
		}
	}
	if t.conflict {
		other := map[string]any{"top_up_id": t.topUpID, "amount_cents": t.amount + 1}
		if ans, err := r.producer.do(ctx, http.MethodPost, path, t.replica, other); err == nil {
			r.fault("top-up conflicting re-post")
			if ans.status != http.StatusConflict || ans.code != "top_up_id_reused" {
				r.topUps.oddf("top-up %s re-posted with another amount: answered %d %s, want 409 top_up_id_reused", k, ans.status, ans.code)
			}
		}
	}
}

// postOnce posts body once with a client that gives up after timeout, and
// returns the answer's status.
func (r *run) postOnce(ctx context.Context, path string, replica int, body any, timeout time.Duration) (int, error) {
	payload, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.apiURLs[replica%len(r.apiURLs)]+path, bytes.NewReader(payload))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+r.producer.key)
	req.Header.Set("Content-Type", "application/json")
	r.producer.stats.sent.Add(1)
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	r.producer.stats.response(resp.StatusCode, "")
	return resp.StatusCode, nil
}

// rePutRecharge puts every recharge customer again with the same body
// while the run goes on: the same terms must not arm a recharge again (one
// top-up per crossing).
func (r *run) rePutRecharge(ctx context.Context, recharge []int, ids []string) {
	for _, i := range recharge {
		ans, err := r.producer.do(ctx, http.MethodPut, "/v1/customers/"+ids[i], i%2, customerBody(i, true))
		switch {
		case err != nil:
			r.logf("re-PUT of %s: %v", ids[i], err)
		case ans.status != http.StatusOK:
			r.topUps.oddf("re-PUT of customer %s with the same body answered %d %s, want 200", ids[i], ans.status, ans.code)
		default:
			r.fault("recharge customer re-put")
		}
	}
}

// waitTopUpsSettled waits, up to most, until no top-up is pending, unknown
// or processing: the run does it before the last period's closes, so a
// grant a top-up buys is never committed while its customer's close reads
// the grants (a grant made just before the close's time but committed after
// its read is valid for the period by time, but not applied: the check
// would report the charge).
func (r *run) waitTopUpsSettled(ctx context.Context, most time.Duration) {
	conn, err := pgx.Connect(ctx, r.dbURL)
	if err != nil {
		r.logf("waiting for top-ups: %v", err)
		return
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(most)
	var open int
	for time.Now().Before(deadline) {
		err := conn.QueryRow(ctx, `SELECT count(*) FROM billing.top_ups WHERE status IN ('pending', 'unknown', 'processing')`).Scan(&open)
		if err == nil && open == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
	r.logf("%d top-ups still open after %s; closing the last period anyway", open, most)
}
