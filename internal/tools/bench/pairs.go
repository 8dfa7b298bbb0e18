package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The machine drifts: measured one after the other, the same commit's
// ingest_spread came out at 0.81× raw_sql one day and 1.26× another. So a
// phase and its baseline are measured in alternating windows (ABAB…, or
// ABCABC… for a rotation of more), pairRounds rounds, and a target's ratio
// is the median of the ratios of each round's windows, with their spread
// in the table: both sides of a pair share the machine's mood of the
// minute.

// pairRounds is how many rounds of windows a rotation measures.
const pairRounds = 3

// rounds is pairRounds, or 1 in a short run.
func (r *run) rounds() int {
	if r.cfg.Short {
		return 1
	}
	return pairRounds
}

// member is one phase of a rotation: measure runs one window of it in
// round (from 0).
type member struct {
	phase   string
	measure func(round int) (loopResult, error)
}

// rotate measures each member's window in turn, rounds times, and returns
// each phase's windows in round order. It stops at the first error.
func (r *run) rotate(rounds int, members ...member) (map[string][]loopResult, error) {
	windows := map[string][]loopResult{}
	for round := range rounds {
		for _, m := range members {
			if err := r.checkpoint(context.Background()); err != nil {
				return nil, err
			}
			lr, err := m.measure(round)
			if err != nil {
				return nil, err
			}
			r.logf("%s window %d: %s/s over %s", m.phase, round+1, formatRate(lr.rate()), lr.elapsed.Round(10*time.Millisecond))
			windows[m.phase] = append(windows[m.phase], lr)
		}
	}
	return windows, nil
}

// pairKey names the pairs of phase against baseline in Report.Pairs.
func pairKey(phase, baseline string) string { return phase + "/" + baseline }

// pair records the ratios, round by round, of phase's windows to
// baseline's (by rate).
func (r *run) pair(phase, baseline string, tally, base []loopResult) {
	ratios := make([]float64, 0, len(tally))
	for i := range min(len(tally), len(base)) {
		if b := base[i].rate(); b > 0 {
			ratios = append(ratios, tally[i].rate()/b)
		}
	}
	r.pairRatios(phase, baseline, ratios)
}

// pairRatios records ratios of phase to baseline, one per round.
func (r *run) pairRatios(phase, baseline string, ratios []float64) {
	if r.report.Pairs == nil {
		r.report.Pairs = map[string][]float64{}
	}
	r.report.Pairs[pairKey(phase, baseline)] = ratios
	r.logf("%s / %s by round: %s", phase, baseline, formatRatios(ratios))
}

// median returns the median of v (not empty).
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// medianDuration returns the median of v (not empty).
func medianDuration(v []time.Duration) time.Duration {
	f := make([]float64, len(v))
	for i, d := range v {
		f[i] = float64(d)
	}
	return time.Duration(median(f))
}

// pairCell is the ratio cell of a paired target: the median and, with more
// than one pair, the spread.
func pairCell(ratios []float64) string {
	if len(ratios) == 1 {
		return fmt.Sprintf("%.2f (1 pair)", ratios[0])
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f, %d pairs)", median(ratios), slices.Min(ratios), slices.Max(ratios), len(ratios))
}

func formatRatios(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(s, ", ")
}
