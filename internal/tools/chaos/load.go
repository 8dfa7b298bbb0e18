package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// plannedEvent is one distinct usage event of the run.
type plannedEvent struct {
	id         string
	customer   string
	period     string
	amount     int64
	occurredAt time.Time
}

func (e *plannedEvent) body(amount int64) map[string]any {
	return map[string]any{
		"customer_id": e.customer, "event_id": e.id, "amount_cents": amount,
		"occurred_at": e.occurredAt.Format(time.RFC3339Nano), "metric": "chaos",
	}
}

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
}

func newLoadStats() *loadStats {
	return &loadStats{responses: map[string]int{}, acked: map[string]int64{}, rejected: map[string]int{}}
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
}

type apiAnswer struct {
	status int
	code   string
	items  []struct {
		Index int    `json:"index"`
		Code  string `json:"code"`
	}
}

const postAttemptsMax = 12

func (p *producer) do(ctx context.Context, method, path string, replica int, body any) (apiAnswer, error) {
	payload, err := json.Marshal(body)
	if err != nil {
		return apiAnswer{}, err
	}
	var lastErr error
	for attempt := range postAttemptsMax {
		base := p.apis[(replica+attempt)%len(p.apis)]
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(payload))
		if err != nil {
			return apiAnswer{}, err
		}
		req.Header.Set("Authorization", "Bearer "+p.key)
		req.Header.Set("Content-Type", "application/json")
		p.stats.sent.Add(1)
		resp, err := p.client.Do(req)
		if err == nil {
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var ans apiAnswer
			var parsed struct {
				Code  string `json:"code"`
				Items []struct {
					Index int    `json:"index"`
					Code  string `json:"code"`
				} `json:"items"`
			}
			_ = json.Unmarshal(raw, &parsed)
			ans.status, ans.code, ans.items = resp.StatusCode, parsed.Code, parsed.Items
			p.stats.response(resp.StatusCode, parsed.Code)
			if resp.StatusCode < 500 {
				return ans, nil
			}
			lastErr = fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, parsed.Code)
		} else {
			lastErr = err
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
			p.stats.ack(e, e.amount+1) // the original never landed: this one is the event
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
			p.stats.ack(e, e.amount)
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
		p.stats.ack(e, e.amount)
	default:
		p.stats.reject(ans.code, 1)
	}
}

// smallCustomer reports whether customer i posts only 1-cent events, so its
// periods' totals fall below Stripe's minimum and are carried forward.
func smallCustomer(i int) bool { return i%25 == 11 }

// planLoad makes the run's events and the order they are posted in: each
// event once, 10% of them again one to three times (half of those to the
// other replica, some inside batches), a few conflicting re-posts, and about
// a third of the events grouped in batches.
func planLoad(rnd *rand.Rand, customers []string, periods []time.Time, events int) ([]post, []*plannedEvent) {
	planned := make([]*plannedEvent, events)
	now := time.Now()
	for i := range planned {
		start := periods[rnd.IntN(len(periods))]
		span := min(time.Hour, now.Sub(start)) // never in the future
		occurred := start.Add(time.Duration(rnd.Int64N(int64(max(span, time.Second)))))
		c := rnd.IntN(len(customers))
		amount := 1 + rnd.Int64N(5000)
		if smallCustomer(c) {
			amount = 1 // totals below Stripe's minimum: carried forward
		}
		planned[i] = &plannedEvent{
			id: fmt.Sprintf("ev-%06d", i), customer: customers[c],
			period: start.Format("2006-01-02T15"), amount: amount, occurredAt: occurred,
		}
	}
	// Batches hold events of one period (of any customers).
	byPeriod := map[string][]*plannedEvent{}
	for _, e := range planned {
		byPeriod[e.period] = append(byPeriod[e.period], e)
	}
	var work []post
	for _, p := range periods {
		list := byPeriod[p.Format("2006-01-02T15")]
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
	// Most of a period's events come before it is closed (the oldest at 40%
	// of the run, the middle one at 70%), as a producer's would; the rest,
	// and the duplicates below, land after and meet period_closed.
	closesAt := map[string]float64{}
	for i, p := range periods {
		closesAt[p.Format("2006-01-02T15")] = []float64{0.45, 0.8, 1}[min(i, 2)]
	}
	at := make([]float64, len(work))
	for i, w := range work {
		at[i] = rnd.Float64() * closesAt[w.events[0].period]
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

	// Duplicates and conflicts go after a random later point of the run.
	for _, e := range planned {
		switch r := rnd.IntN(1000); {
		case r < 100:
			for range 1 + rnd.IntN(3) {
				at := rnd.IntN(len(work) + 1)
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
