package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Targets of GitHub issue 11, judged on figures of the same run.
const (
	spreadP99Max = 15 * time.Millisecond // GitHub issue 26 (20 ms before)
	usageP99Max  = 20 * time.Millisecond // GitHub issue 24: a customer-period of 1,000,000 events
	memoryMax    = 150_000_000           // bytes: 150 MB
)

// ratioTargets are the throughput targets: phase ≥ min × baseline; with
// p50, the latency target phase's p50 ≤ max × baseline's p50. Where the run
// measured the two in alternating windows (Report.Pairs), the ratio is the
// median of the rounds' ratios.
//
// A min of zero is a comparison shown for information, never judged: the
// single-event ingest beside raw SQL pipelined in one round trip, a stricter
// baseline than the (a transaction of BEGIN, two INSERTs, COMMIT).
var ratioTargets = []struct {
	phase, baseline string
	min             float64
	p50             bool
	max             float64
	optional        bool // a row only when measured
}{
	{phase: PhaseIngestSpread, baseline: PhaseRawSQL, min: 1.5}, // GitHub issue 26 (0.8 before)
	{phase: PhaseIngestSpread, baseline: PhaseRawSQLPipelined},
	{phase: PhaseIngestRollups, baseline: PhaseIngestRollupsOff, min: 0.95},           // GitHub issues 14 and 24: roll-ups and thresholds cost ingest at most 5%
	{phase: PhaseIngestHot, baseline: PhaseIngestSpread, min: 0.9},                    // GitHub issue 26 (0.5 before)
	{phase: PhaseIngestSerial, baseline: PhaseIngestSerialAlone, p50: true, max: 1.1}, // GitHub issue 26: a lone client waits for no group
	{phase: PhaseIngestBatch, baseline: PhaseRawCopy, min: 0.8},                       // GitHub issue 26 (0.4 before)
	{phase: PhaseIngestAfterLoad, baseline: PhaseIngestSpread, min: 0.9},
	{phase: PhaseCharges, baseline: PhaseRiverNoop, min: 0.8},     // GitHub issue 26 (0.5 before)
	{phase: PhaseClosesCredits, baseline: PhaseCloses, min: 0.91}, // GitHub issue 25: a close with credits costs under 10% more (1/1.1)
	// GitHub issue 27: through PgBouncer in transaction mode, judged only
	// when measured (--pgbouncer).
	{phase: PhaseIngestSpreadPooled, baseline: PhaseIngestSpread, min: 0.8, optional: true},
	{phase: PhaseIngestBatchPooled, baseline: PhaseIngestBatch, min: 0.8, optional: true},
	{phase: PhaseChargesPooled, baseline: PhaseCharges, min: 0.8, optional: true},
	// GitHub issue 27: on a clone of the preloaded ledger, judged only
	// when measured (--preload N).
	{phase: PhaseIngestSpreadPreloaded, baseline: PhaseIngestSpread, min: 0.9, optional: true},
	{phase: PhaseIngestBatchPreloaded, baseline: PhaseIngestBatch, min: 0.9, optional: true},
	{phase: PhaseChargesPreloaded, baseline: PhaseCharges, min: 0.9, optional: true},
	{phase: PhaseClosesPreloaded, baseline: PhaseCloses, min: 0.9, optional: true},
}

// Result is what one phase measured.
type Result struct {
	Phase   string
	Unit    string        // what Count counts, per second: "events/s", "jobs/s", "charges/s"
	Count   int64         // events, jobs or charges done
	Calls   int64         // HTTP requests or transactions that carried them
	Elapsed time.Duration // the time Count is divided by
	Latency *Latency      // per call; nil where calls are not timed one by one
	Note    string        // anything else worth knowing (where the time went)

	// WindowP99 is the p99 of each window, in round order, when the phase
	// was measured in a rotation (pairs.go).
	WindowP99 []time.Duration
}

// Rate returns Count per second of Elapsed.
func (r *Result) Rate() float64 {
	if r == nil || r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Count) / r.Elapsed.Seconds()
}

// summary is the result as one line.
func (r *Result) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s %s (%s in %s", r.Phase, formatRate(r.Rate()), r.Unit,
		formatCount(r.Count)+" "+strings.TrimSuffix(r.Unit, "/s"), r.Elapsed.Round(10*time.Millisecond))
	if r.Calls > 0 && r.Calls != r.Count {
		fmt.Fprintf(&b, ", %s calls", formatCount(r.Calls))
	}
	if r.Latency != nil {
		fmt.Fprintf(&b, "; %s", r.Latency)
	}
	b.WriteString(")")
	if r.Note != "" {
		b.WriteString("; " + r.Note)
	}
	return b.String()
}

func (l *Latency) String() string {
	return fmt.Sprintf("p50 %s, p99 %s, p999 %s, max %s", ms(l.P50), ms(l.P99), ms(l.P999), ms(l.Max))
}

// Header describes where and what was measured.
type Header struct {
	Date       time.Time
	CPUs       int
	MemTotal   int64 // bytes, from /proc/meminfo
	PGVersion  string
	PGSettings string // "fsync on, synchronous_commit on"
	Commit     string // short hash, -dirty when the tree has changes
	Command    string
}

func (h Header) String() string {
	return fmt.Sprintf("%s · %d CPUs, %.1f GiB RAM · PostgreSQL %s; %s · commit %s · `%s`",
		h.Date.Format("2006-01-02 15:04 UTC"), h.CPUs, float64(h.MemTotal)/(1<<30), h.PGVersion, h.PGSettings, h.Commit, h.Command)
}

// Target is one judged target, as a row of the table.
type Target struct {
	Name     string // the phase, or what is judged of it
	Tally    string
	Baseline string
	Ratio    string
	Want     string
	Status   string // StatusMet, StatusMissed or StatusNotMeasured
}

// Target statuses.
const (
	StatusMet         = "met"
	StatusInfo        = "(information)"
	StatusMissed      = "missed"
	StatusNotMeasured = "not measured"
)

// Report is a run's outcome.
type Report struct {
	Header  Header
	Short   bool // nothing is asserted
	Results map[string]*Result
	// Pairs holds, by pairKey, the ratios of a phase to its baseline
	// measured in alternating windows, one per round (pairs.go).
	Pairs      map[string][]float64
	MemoryPeak int64  // the largest resident set of any Tally server, bytes
	MemoryWho  string // which server
	Failures   []string
	Targets    []Target

	// Ledger holds, with --preload, what was measured of the preloaded
	// ledger itself; nil without.
	Ledger *LedgerFigures
}

// judge fills Targets from Results.
func (r *Report) judge() {
	r.Targets = nil
	status := func(ok bool) string {
		if ok {
			return StatusMet
		}
		return StatusMissed
	}
	add := func(t Target, measured, ok bool) {
		t.Status = StatusNotMeasured
		if measured {
			t.Status = status(ok)
		}
		r.Targets = append(r.Targets, t)
	}
	cell := func(res *Result, label string) string {
		if res == nil {
			return "—"
		}
		s := formatRate(res.Rate()) + " " + res.Unit
		if label != "" {
			s = label + " " + s
		}
		if res.Latency != nil {
			s += fmt.Sprintf(" (p50 %s, p99 %s, p999 %s)", ms(res.Latency.P50), ms(res.Latency.P99), ms(res.Latency.P999))
		}
		return s
	}
	for i, rt := range ratioTargets {
		tally, base := r.Results[rt.phase], r.Results[rt.baseline]
		if rt.p50 {
			t := Target{Name: rt.phase + " p50", Tally: "—", Baseline: "—", Ratio: "—",
				Want: fmt.Sprintf("≤ %s× %s p50", strconv.FormatFloat(rt.max, 'f', -1, 64), rt.baseline)}
			if tally != nil && tally.Latency != nil {
				t.Tally = ms(tally.Latency.P50)
			}
			if base != nil && base.Latency != nil {
				t.Baseline = rt.baseline + " " + ms(base.Latency.P50)
			}
			ratios := r.Pairs[pairKey(rt.phase+" p50", rt.baseline)]
			if len(ratios) > 0 {
				t.Ratio = pairCell(ratios)
			}
			add(t, len(ratios) > 0, len(ratios) > 0 && median(ratios) <= rt.max)
			continue
		}
		t := Target{Name: rt.phase, Tally: cell(tally, ""), Baseline: cell(base, rt.baseline), Ratio: "—",
			Want: fmt.Sprintf("≥ %s× %s", strconv.FormatFloat(rt.min, 'f', -1, 64), rt.baseline)}
		measured := tally != nil && base != nil && base.Rate() > 0
		ratio := 0.0
		if ratios := r.Pairs[pairKey(rt.phase, rt.baseline)]; len(ratios) > 0 {
			measured, ratio, t.Ratio = true, median(ratios), pairCell(ratios)
		} else if measured {
			ratio = tally.Rate() / base.Rate()
			t.Ratio = fmt.Sprintf("%.2f", ratio)
		}
		if rt.min == 0 {
			t.Want, t.Status = "— (beside "+rt.baseline+")", StatusInfo
			if measured {
				r.Targets = append(r.Targets, t)
			}
			continue
		}
		if rt.optional && !measured {
			continue
		}
		add(t, measured, ratio >= rt.min)
		if i == 0 { // the latency target of ingest_spread follows its throughput
			// Judged, as the ratios are, on the median of the windows (the
			// p99 of each window): one window the machine spent elsewhere
			// does not decide. The Tally cell is the p99 of every call.
			spread, raw := r.Results[PhaseIngestSpread], r.Results[PhaseRawSQL]
			t := Target{Name: PhaseIngestSpread + " p99", Tally: "—", Baseline: "—", Ratio: "—",
				Want: "≤ " + ms(spreadP99Max) + " (median of the windows)"}
			if spread != nil && spread.Latency != nil {
				t.Tally = ms(spread.Latency.P99) + " (every call)"
			}
			if raw != nil && raw.Latency != nil {
				t.Baseline = PhaseRawSQL + " " + ms(raw.Latency.P99)
			}
			measured := spread != nil && spread.Latency != nil
			p99 := time.Duration(0)
			if measured {
				p99 = spread.Latency.P99
				if w := spread.WindowP99; len(w) > 0 {
					p99 = medianDuration(w)
					t.Ratio = fmt.Sprintf("%s (%s–%s, %d windows)", ms(p99), ms(slices.Min(w)), ms(slices.Max(w)), len(w))
				}
			}
			add(t, measured, measured && p99 <= spreadP99Max)
		}
	}
	uq := r.Results[PhaseUsageQuery]
	ut := Target{Name: PhaseUsageQuery + " p99", Tally: "—", Baseline: "—", Ratio: "—", Want: "≤ " + ms(usageP99Max)}
	if uq != nil && uq.Latency != nil {
		ut.Tally = ms(uq.Latency.P99)
	}
	add(ut, uq != nil && uq.Latency != nil, uq != nil && uq.Latency != nil && uq.Latency.P99 <= usageP99Max)
	t := Target{Name: "server RSS (max)", Tally: "—", Baseline: "—", Ratio: "—", Want: fmt.Sprintf("≤ %d MB", memoryMax/1_000_000)}
	if r.MemoryPeak > 0 {
		t.Tally = fmt.Sprintf("%.1f MB (%s)", float64(r.MemoryPeak)/1e6, r.MemoryWho)
	}
	add(t, r.MemoryPeak > 0, r.MemoryPeak <= memoryMax)
}

// Missed returns the targets missed.
func (r *Report) Missed() []Target {
	var missed []Target
	for _, t := range r.Targets {
		if t.Status == StatusMissed {
			missed = append(missed, t)
		}
	}
	return missed
}

// OK reports whether the run passes: no phase failed and, unless Short,
// no target was missed.
func (r *Report) OK() bool {
	return len(r.Failures) == 0 && (r.Short || len(r.Missed()) == 0)
}

// Write writes the report as markdown: the header line, the table of
// targets, one line per phase, and the verdict.
func (r *Report) Write(w io.Writer) {
	fmt.Fprintf(w, "make bench · %s\n\n", r.Header)
	fmt.Fprintln(w, "| phase | Tally | baseline | ratio | target | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, t := range r.Targets {
		status := t.Status
		if status == StatusMissed {
			status = "**missed**"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", t.Name, t.Tally, t.Baseline, t.Ratio, t.Want, status)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Phases, in the order they ran (each rate is per second of the phase's own elapsed time):")
	fmt.Fprintln(w)
	for _, p := range Phases {
		if res := r.Results[p]; res != nil {
			fmt.Fprintf(w, "- %s\n", res.summary())
		}
	}
	fmt.Fprintln(w)
	if r.Ledger != nil {
		r.Ledger.write(w)
		fmt.Fprintln(w)
	}
	for _, f := range r.Failures {
		fmt.Fprintf(w, "FAILED %s\n", f)
	}
	missed := len(r.Missed())
	switch {
	case r.Short:
		fmt.Fprintf(w, "--short: nothing asserted (%d of %d targets would be missed).\n", missed, len(r.Targets))
	case missed > 0:
		fmt.Fprintf(w, "%d of %d targets missed.\n", missed, len(r.Targets))
	default:
		fmt.Fprintf(w, "Every measured target met.\n")
	}
}

// ms formats d in milliseconds with three significant figures or so.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

// formatRate formats a rate: whole numbers with thousands separators from
// 100 up, one decimal below.
func formatRate(v float64) string {
	if v >= 100 {
		return formatCount(int64(v + 0.5))
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// formatCount formats n with thousands separators.
func formatCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	if n < 0 {
		return "-" + formatCount(-n)
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
