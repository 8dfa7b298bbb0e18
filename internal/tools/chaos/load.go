package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// plannedEvent is one distinct usage event of the run: pre-priced
// (amount_cents, metric "chaos" as a label) or, with metric set, a quantity
// of metric.
type plannedEvent struct {
	id       string
	customer string
	period   string
	// amount is a pre-priced event's amount in cents, or a quantity event's
	// quantity in thousandths of a unit (quantityText).
	amount     int64
	metric     string
	occurredAt time.Time
}

// body is the event as posted, with amount (cents or thousandths of a
// unit) in place of e.amount, for conflicting re-posts. A quantity goes as
// a JSON number or, for an odd amount, as a decimal in a string: the API
// takes both.
func (e *plannedEvent) body(amount int64) map[string]any {
	b := map[string]any{"customer_id": e.customer, "event_id": e.id, "occurred_at": e.occurredAt.Format(time.RFC3339Nano)}
	if e.metric == "" {
		b["amount_cents"], b["metric"] = amount, "chaos"
		return b
	}
	b["metric"], b["quantity"] = e.metric, json.Number(quantityText(amount))
	if amount%2 != 0 {
		b["quantity"] = quantityText(amount)
	}
	return b
}

// quantityText writes a quantity in thousandths as a decimal, always with
// three digits after the point ("1000.000", "0.005").
func quantityText(milli int64) string {
	return fmt.Sprintf("%d.%03d", milli/1000, milli%1000)
}

// chaosVoidEvery is how rare voids are in the chaos run: about one
// acknowledged event in this many is voided right after its 2xx.
const chaosVoidEvery = 20

// post is one unit of the producers' work: a single event, or a batch.
type post struct {
	events   []*plannedEvent
	conflict bool // re-post events[0] with a different amount
	replica  int  // preferred API replica
}

// loadStats counts what the producers saw.
type loadStats struct {
	mu        sync.Mutex
	sent      atomic.Int64 // HTTP requests
	posts     atomic.Int64 // event posts (each event of a batch counts)
	responses map[string]int
	acked     map[string]int64 // customer/event → amount acknowledged with 2xx
	rejected  map[string]int   // reason → events
	voided    map[string]bool  // customer/event → its void acknowledged with 2xx
	voidLost  map[string]bool  // customer/event → its void's answer never came (it may have landed)
	outage    *outage          // the database fault being measured, or nil
}

// outage is one database fault as the producers saw it: when it began,
// the acknowledgements of requests sent after that, and the answers
// refused meanwhile ("503 database_unavailable", "network error").
type outage struct {
	at      time.Time
	acks    []time.Time
	refused map[string]int
}

// outageMeasure is what an outage came to.
type outageMeasure struct {
	at       time.Time      // when the fault began
	firstAck time.Duration  // from the fault to the first acknowledgement
	longest  time.Duration  // the longest time without one, from the fault on
	refused  map[string]int // answers refused
}

// outageBegin starts measuring a database fault that begins now.
func (s *loadStats) outageBegin() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outage = &outage{at: time.Now(), refused: map[string]int{}}
}

// outageAcked reports whether a request sent after the fault began was
// acknowledged since after.
func (s *loadStats) outageAcked(after time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outage != nil && len(s.outage.acks) > 0 && !s.outage.acks[len(s.outage.acks)-1].Before(after)
}

// outageEnd stops measuring and returns the measure (false: no request
// sent after the fault was acknowledged).
func (s *loadStats) outageEnd() (outageMeasure, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.outage
	s.outage = nil
	if o == nil {
		return outageMeasure{at: time.Now()}, false
	}
	m := outageMeasure{at: o.at, refused: o.refused}
	if len(o.acks) == 0 {
		return m, false
	}
	m.firstAck = o.acks[0].Sub(o.at)
	prev := o.at
	for _, a := range o.acks {
		m.longest = max(m.longest, a.Sub(prev))
		prev = a
	}
	return m, true
}

// answered records, for the outage being measured, a request sent at sent
// and answered with status and code (status 0: a network error).
func (s *loadStats) answered(sent time.Time, status int, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.outage
	if o == nil || sent.Before(o.at) {
		return
	}
	switch {
	case status == 0:
		o.refused["network error"]++
	case status >= 500:
		o.refused[fmt.Sprintf("%d %s", status, code)]++
	case status < 300:
		o.acks = append(o.acks, time.Now())
	}
}

func newLoadStats() *loadStats {
	return &loadStats{responses: map[string]int{}, acked: map[string]int64{}, rejected: map[string]int{},
		voided: map[string]bool{}, voidLost: map[string]bool{}}
}

func (s *loadStats) response(status int, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.responses[fmt.Sprintf("%d %s", status, code)]++
}

func (s *loadStats) ack(e *plannedEvent, amount int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acked[e.customer+"/"+e.id] = amount
}

func (s *loadStats) reject(reason string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejected[reason] += n
}

// producer posts events over HTTP as a careful producer would: on a
// network error or a 5xx it retries the same body (the event_id makes that
// safe), switching API replicas.
type producer struct {
	apis   []string
	key    string
	client *http.Client
	stats  *loadStats
	// voidEvery, when set, voids about one acknowledged event in
	// voidEvery (chosen by its id), right after its acknowledgement.
	voidEvery uint32
	// retryFor is how long a request is retried on a network error or a
	// 5xx before the producer gives up on it (postRetryFor when zero).
	retryFor time.Duration
}

// postRetryFor is how long a producer retries a request by default: past a
// Postgres restart and a replica's kill.
const postRetryFor = 10 * time.Second

type apiAnswer struct {
	status  int
	code    string
	version int32 // a plan version's, from PUT /v1/plans/{plan_id}
	items   []struct {
		Index int    `json:"index"`
		Code  string `json:"code"`
	}
}

func (p *producer) do(ctx context.Context, method, path string, replica int, body any) (apiAnswer, error) {
	payload, err := json.Marshal(body)
	if err != nil {
		return apiAnswer{}, err
	}
	retryFor := p.retryFor
	if retryFor == 0 {
		retryFor = postRetryFor
	}
	var lastErr error
	for attempt, start := 0, time.Now(); attempt == 0 || time.Since(start) < retryFor; attempt++ {
		base := p.apis[(replica+attempt)%len(p.apis)]
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(payload))
		if err != nil {
			return apiAnswer{}, err
		}
		req.Header.Set("Authorization", "Bearer "+p.key)
		req.Header.Set("Content-Type", "application/json")
		p.stats.sent.Add(1)
		sent := time.Now()
		resp, err := p.client.Do(req)
		if err == nil {
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var ans apiAnswer
			var parsed struct {
				Code    string `json:"code"`
				Version int32  `json:"version"`
				Items   []struct {
					Index int    `json:"index"`
					Code  string `json:"code"`
				} `json:"items"`
			}
			_ = json.Unmarshal(raw, &parsed)
			ans.status, ans.code, ans.version, ans.items = resp.StatusCode, parsed.Code, parsed.Version, parsed.Items
			p.stats.response(resp.StatusCode, parsed.Code)
			p.stats.answered(sent, resp.StatusCode, parsed.Code)
			if resp.StatusCode < 500 {
				return ans, nil
			}
			lastErr = fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, parsed.Code)
		} else {
			lastErr = err
			p.stats.answered(sent, 0, "")
		}
		if ctx.Err() != nil {
			return apiAnswer{}, ctx.Err()
		}
		time.Sleep(time.Duration(min(100*(attempt+1), 1000)) * time.Millisecond)
	}
	return apiAnswer{}, lastErr
}

// send posts one unit of work and records what was acknowledged.
func (p *producer) send(ctx context.Context, w post) {
	if w.conflict {
		e := w.events[0]
		p.stats.posts.Add(1)
		ans, err := p.do(ctx, http.MethodPost, "/v1/usage-events", w.replica, e.body(e.amount+1))
		switch {
		case err != nil:
			p.stats.reject("gave up (network)", 1)
		case ans.status/100 == 2:
			p.acked(ctx, e, e.amount+1, w.replica) // the original never landed: this one is the event
		default:
			p.stats.reject(ans.code, 1)
		}
		return
	}
	if len(w.events) == 1 {
		p.postOne(ctx, w.events[0], w.replica)
		return
	}
	bodies := make([]map[string]any, len(w.events))
	for i, e := range w.events {
		bodies[i] = e.body(e.amount)
	}
	p.stats.posts.Add(int64(len(w.events)))
	ans, err := p.do(ctx, http.MethodPost, "/v1/usage-events/batch", w.replica, map[string]any{"events": bodies})
	switch {
	case err != nil:
		p.stats.reject("gave up (network)", len(w.events))
	case ans.status/100 == 2:
		for _, e := range w.events {
			p.acked(ctx, e, e.amount, w.replica)
		}
	default:
		// All-or-nothing: post the items that were not at fault one by one.
		failed := map[int]string{}
		for _, it := range ans.items {
			failed[it.Index] = it.Code
		}
		for i, e := range w.events {
			if code, ok := failed[i]; ok {
				p.stats.reject(code, 1)
				continue
			}
			p.postOne(ctx, e, w.replica)
		}
	}
}

func (p *producer) postOne(ctx context.Context, e *plannedEvent, replica int) {
	p.stats.posts.Add(1)
	ans, err := p.do(ctx, http.MethodPost, "/v1/usage-events", replica, e.body(e.amount))
	switch {
	case err != nil:
		p.stats.reject("gave up (network)", 1)
	case ans.status/100 == 2:
		p.acked(ctx, e, e.amount, replica)
	default:
		p.stats.reject(ans.code, 1)
	}
}

// acked records e as acknowledged with amount and, when it is one of the
// events the producer voids, voids it: a void acknowledged is recorded, one
// refused because the period closed meanwhile is not, and one whose answer
// never came may or may not have landed.
func (p *producer) acked(ctx context.Context, e *plannedEvent, amount int64, replica int) {
	p.stats.ack(e, amount)
	if p.voidEvery == 0 {
		return
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(e.customer + "/" + e.id))
	if h.Sum32()%p.voidEvery != 0 {
		return
	}
	k := e.customer + "/" + e.id
	ans, err := p.do(ctx, http.MethodPost, "/v1/usage-events/void", replica,
		map[string]any{"customer_id": e.customer, "event_id": e.id, "reason": "chaos: voided after its acknowledgement"})
	p.stats.mu.Lock()
	defer p.stats.mu.Unlock()
	switch {
	case err != nil:
		p.stats.voidLost[k] = true
	case ans.status/100 == 2:
		p.stats.voided[k] = true
	default:
		p.stats.rejected["void: "+ans.code]++
	}
}

// smallCustomer reports whether customer i posts only 1-cent events, so its
// periods' totals fall below Stripe's minimum and are carried forward.
func smallCustomer(i int) bool { return i%25 == 11 }

// planCustomer reports whether customer i is on chaosPlanID: a third of
// the customers (none of the small ones), whose events are mostly
// quantities rated at the close.
func planCustomer(i int) bool { return i%3 == 1 && !smallCustomer(i) }

// chaosTargets are, per metric, the net quantities (in thousandths) a
// plan customer's period is made to reach, one chosen at random with its
// events splitting it: zero, exactly on a tier or package bound of either
// version, just either side of one, under a minimum, or anything. Events
// refused (posted after their period closed) or conflicting re-posts may
// move a period off its target; the check rates whatever the ledger holds.
var chaosTargets = map[string][]int64{
	"api_calls":  {0, 1_000_000, 10_000_000, 999_999, 1_000_001, -20_000_000},
	"storage_gb": {0, 10_000, 100_000, 10_001, 500, -300_000},
	"seats":      {0, 5_000, 10_000, 20_000, 7_500, -40_000},
}

// planEvents makes the quantity events of the plan customers, about budget
// of them: for each (customer, period, metric), in random order, a target
// from chaosTargets (a negative one means a random quantity up to its
// magnitude) split into a few events with three decimals each, until the
// budget is spent. A sixth of the triples get no events (a metric without
// a line).
func planEvents(rnd *rand.Rand, customers []string, periods []time.Time, budget int, newEvent func(c int, start time.Time) *plannedEvent) []*plannedEvent {
	type triple struct {
		c      int
		start  time.Time
		metric string
	}
	var triples []triple
	for c := range customers {
		if !planCustomer(c) {
			continue
		}
		for _, p := range periods {
			for _, m := range sortedKeys(chaosTargets) {
				triples = append(triples, triple{c, p, m})
			}
		}
	}
	if len(triples) == 0 || budget <= 0 {
		return nil
	}
	rnd.Shuffle(len(triples), func(i, j int) { triples[i], triples[j] = triples[j], triples[i] })
	avg := max(1, budget/len(triples))
	var out []*plannedEvent
	for _, t := range triples {
		if len(out) >= budget {
			break
		}
		if rnd.IntN(6) == 0 {
			continue
		}
		targets := chaosTargets[t.metric]
		target := targets[rnd.IntN(len(targets))]
		if target < 0 {
			target = rnd.Int64N(-target + 1)
		}
		n := 1 + rnd.IntN(2*avg)
		cuts := make([]int64, n+1)
		cuts[n] = target
		for i := 1; i < n; i++ {
			cuts[i] = rnd.Int64N(target + 1)
		}
		sort.Slice(cuts, func(i, j int) bool { return cuts[i] < cuts[j] })
		for i := range n {
			e := newEvent(t.c, t.start)
			e.metric, e.amount = t.metric, cuts[i+1]-cuts[i]
			out = append(out, e)
		}
	}
	return out
}

// planLoad makes the run's events and the order they are posted in: each
// event once, 10% of them again one to three times (half of those to the
// other replica, some inside batches), a few conflicting re-posts, and about
// a third of the events grouped in batches. The plan customers' share of
// the events are quantity events (planEvents); the rest are pre-priced, of
// any customer. The plan customers' events in the last period come after
// 30% of the run, after the plan got its second version (at
// planVersion2At), so their last periods open with it.
func planLoad(rnd *rand.Rand, customers []string, periods []time.Time, events int) ([]post, []*plannedEvent) {
	now := time.Now()
	newEvent := func(c int, start time.Time) *plannedEvent {
		span := min(time.Hour, now.Sub(start)) // never in the future
		occurred := start.Add(time.Duration(rnd.Int64N(int64(max(span, time.Second)))))
		return &plannedEvent{customer: customers[c], period: start.Format("2006-01-02T15"), occurredAt: occurred}
	}
	onPlan := 0
	for c := range customers {
		if planCustomer(c) {
			onPlan++
		}
	}
	planned := planEvents(rnd, customers, periods, events*onPlan/max(len(customers), 1), newEvent)
	for len(planned) < events {
		c := rnd.IntN(len(customers))
		e := newEvent(c, periods[rnd.IntN(len(periods))])
		e.amount = 1 + rnd.Int64N(5000)
		if smallCustomer(c) {
			e.amount = 1 // totals below Stripe's minimum: carried forward
		}
		planned = append(planned, e)
	}
	rnd.Shuffle(len(planned), func(i, j int) { planned[i], planned[j] = planned[j], planned[i] })
	for i, e := range planned {
		e.id = fmt.Sprintf("ev-%06d", i)
	}
	last := periods[len(periods)-1].Format("2006-01-02T15")
	isPlan := map[string]bool{}
	for c, id := range customers {
		isPlan[id] = planCustomer(c)
	}
	late := func(e *plannedEvent) bool { return isPlan[e.customer] && e.period == last }
	// Batches hold events of one period (of any customers), the plan
	// customers' late events apart.
	type group struct {
		period string
		late   bool
	}
	byGroup := map[group][]*plannedEvent{}
	for _, e := range planned {
		g := group{e.period, late(e)}
		byGroup[g] = append(byGroup[g], e)
	}
	var work []post
	for _, p := range periods {
		for _, l := range []bool{false, true} {
			list := byGroup[group{p.Format("2006-01-02T15"), l}]
			for i := 0; i < len(list); {
				if rnd.IntN(3) == 0 {
					n := min(5+rnd.IntN(36), len(list)-i)
					work = append(work, post{events: list[i : i+n], replica: rnd.IntN(2)})
					i += n
					continue
				}
				work = append(work, post{events: list[i : i+1], replica: rnd.IntN(2)})
				i++
			}
		}
	}
	// Most of a period's events come before it is closed (the oldest at 45%
	// of the run, the middle one at 80%), as a producer's would; the rest,
	// and the duplicates below, land after and meet period_closed.
	closesAt := map[string]float64{}
	for i, p := range periods {
		closesAt[p.Format("2006-01-02T15")] = []float64{0.45, 0.8, 1}[min(i, 2)]
	}
	at := make([]float64, len(work))
	for i, w := range work {
		at[i] = rnd.Float64() * closesAt[w.events[0].period]
		if late(w.events[0]) {
			at[i] = planVersion2At + 0.05 + rnd.Float64()*(1-planVersion2At-0.05)
		}
	}
	order := make([]int, len(work))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(i, j int) bool { return at[order[i]] < at[order[j]] })
	sorted := make([]post, len(work))
	for i, o := range order {
		sorted[i] = work[o]
	}
	work = sorted

	// Duplicates and conflicts go at a random point of the run; a late
	// event's after the first late post, so they do not open its period
	// before the plan's second version.
	firstLate := sort.SearchFloat64s(sortedAt(at, order), planVersion2At+0.05)
	for _, e := range planned {
		switch r := rnd.IntN(1000); {
		case r < 100:
			for range 1 + rnd.IntN(3) {
				at := rnd.IntN(len(work) + 1)
				if late(e) {
					at = min(firstLate, len(work)) + rnd.IntN(len(work)+1-min(firstLate, len(work)))
				}
				dup := post{events: []*plannedEvent{e}, replica: rnd.IntN(2)}
				if rnd.IntN(4) == 0 && at < len(work) && len(work[at].events) > 1 {
					// A duplicate inside a batch with other events.
					dup.events = append([]*plannedEvent{e}, work[at].events[:min(3, len(work[at].events))]...)
				}
				work = append(work, post{})
				copy(work[at+1:], work[at:])
				work[at] = dup
			}
		case r < 103:
			work = append(work, post{events: []*plannedEvent{e}, conflict: true, replica: rnd.IntN(2)})
		}
	}
	return work, planned
}

// sortedAt is at in the order given.
func sortedAt(at []float64, order []int) []float64 {
	out := make([]float64, len(order))
	for i, o := range order {
		out[i] = at[o]
	}
	return out
}
