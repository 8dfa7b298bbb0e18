package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// opFunc is one unit of closed-loop work by client number client (0 …
// clients-1); seq counts that client's calls from 0. It returns how many
// units (events, rows) the call carried, or an error.
type opFunc func(ctx context.Context, client, seq int) (units int, err error)

// loopResult is what a closed loop measured.
type loopResult struct {
	ops       int64           // calls that succeeded
	units     int64           // units they carried
	errors    int64           // calls that failed
	firstErr  error           // the first failure, as a sample
	elapsed   time.Duration   // from the start until the last call returned
	latencies []time.Duration // one per successful call, sorted
}

// rate returns units per second of elapsed time.
func (r loopResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.units) / r.elapsed.Seconds()
}

// loopErrorsMax stops a loop early: past this many failed calls, the rest
// would only repeat the sample.
const loopErrorsMax = 100

// closedLoop runs clients goroutines that each call op back to back (a new
// call as soon as the previous one returns) until d has passed since the
// start, maxOps calls have been started in total (0: no limit), loopErrorsMax
// calls have failed, or ctx is done. Calls in flight at the deadline are
// waited for and counted. The latency of every successful call is recorded.
func closedLoop(ctx context.Context, clients int, d time.Duration, maxOps int64, op opFunc) loopResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		started atomic.Int64
		mu      sync.Mutex
		res     loopResult
		wg      sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 1024)
			var units int64
			var firstErr error
			for seq := 0; ctx.Err() == nil && time.Now().Before(deadline); seq++ {
				if maxOps > 0 && started.Add(1) > maxOps {
					break
				}
				t0 := time.Now()
				n, err := op(ctx, c, seq)
				took := time.Since(t0)
				if err != nil {
					if ctx.Err() != nil {
						break // canceled mid-call: not the system's failure
					}
					if firstErr == nil {
						firstErr = fmt.Errorf("client %d call %d: %w", c, seq, err)
					}
					mu.Lock()
					res.errors++
					if res.errors >= loopErrorsMax {
						cancel()
					}
					mu.Unlock()
					continue
				}
				units += int64(n)
				lat = append(lat, took)
			}
			mu.Lock()
			defer mu.Unlock()
			res.ops += int64(len(lat))
			res.units += units
			res.latencies = append(res.latencies, lat...)
			if res.firstErr == nil {
				res.firstErr = firstErr
			}
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	slices.Sort(res.latencies)
	return res
}

// eachOnce calls do once for every k in 0 … n-1 from clients goroutines
// (client is the caller's number), within timeout: a closed loop bounded by
// count.
func eachOnce(ctx context.Context, clients, n int, timeout time.Duration, do func(ctx context.Context, client, k int) (units int, err error)) loopResult {
	var next atomic.Int64
	return closedLoop(ctx, clients, timeout, int64(n), func(ctx context.Context, client, _ int) (int, error) {
		return do(ctx, client, int(next.Add(1)-1))
	})
}

// Latency is the distribution of per-call latencies of a phase, exact (from
// every call, sorted), nearest-rank percentiles.
type Latency struct {
	N    int
	P50  time.Duration
	P99  time.Duration
	P999 time.Duration
	Max  time.Duration
}

// newLatency summarizes sorted latencies; nil when there are none.
func newLatency(sorted []time.Duration) *Latency {
	if len(sorted) == 0 {
		return nil
	}
	return &Latency{N: len(sorted), P50: percentile(sorted, 0.50), P99: percentile(sorted, 0.99),
		P999: percentile(sorted, 0.999), Max: sorted[len(sorted)-1]}
}

// percentile returns the nearest-rank p-quantile of sorted (not empty): the
// smallest value with at least p of all values at or below it.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(float64(len(sorted))*p - 1e-9)) // the epsilon keeps an exact rank exact
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}
