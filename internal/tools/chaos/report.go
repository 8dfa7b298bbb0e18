package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Report is what a run did and found.
type Report struct {
	Seed           int64
	Duration       time.Duration
	Customers      int
	EventsPlanned  int
	EventPosts     int64 // event posts, duplicates and conflicts included
	HTTPRequests   int64
	EventsAcked    int // distinct events acknowledged with 2xx
	EventsInLedger int
	VoidsAcked     int // voids acknowledged with 2xx
	VoidsInLedger  int
	Rejected       map[string]int // reason → events
	Responses      map[string]int // "status code" → responses
	Faults         map[string]int // fault → count
	Outages        []string       // each database fault as the producers saw it (HA runs)
	Charges        map[string]int // status → charges
	PaymentIntents int
	Lines          map[string]int // charge lines rated again and checked, by what they cover
	Credits        map[string]int // grants, and their applied and expired entries, checked
	TopUps         map[string]int // top-ups posted, bought, recharged, by outcome, and their PaymentIntents
	Violations     []string
}

// OK reports whether the run found no violation.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// LinesChecked is how many charge lines the check rated again: the usage
// lines (counted by plan version) and the others.
func (r *Report) LinesChecked() int {
	n := 0
	for k, c := range r.Lines {
		if k == "pre_priced" || k == "carried" || strings.HasPrefix(k, "usage "+chaosPlanID+" v") {
			n += c
		}
	}
	return n
}

// Line is the one-line summary of the run.
func (r *Report) Line() string {
	return fmt.Sprintf("seed=%d duration=%s events=%d acked=%d charges=%s lines=%d top_ups=bought:%d,recharges:%d,succeeded:%d,failed:%d payment_intents=%d kills=%d violations=%d",
		r.Seed, r.Duration.Round(time.Second), r.EventsPlanned, r.EventsAcked, formatCounts(r.Charges), r.LinesChecked(),
		r.TopUps["bought"], r.TopUps["recharges"], r.TopUps["succeeded"], r.TopUps["failed"], r.PaymentIntents, r.Faults["kill"],
		len(r.Violations))
}

// Write prints the full report.
func (r *Report) Write(w io.Writer) {
	fmt.Fprintf(w, "\n=== chaos report ===\n")
	fmt.Fprintf(w, "seed                 %d\n", r.Seed)
	fmt.Fprintf(w, "duration             %s\n", r.Duration.Round(time.Second))
	fmt.Fprintf(w, "customers            %d (3 hourly periods each)\n", r.Customers)
	fmt.Fprintf(w, "events planned       %d\n", r.EventsPlanned)
	fmt.Fprintf(w, "event posts          %d (duplicates, batches and conflicting re-posts included)\n", r.EventPosts)
	fmt.Fprintf(w, "http requests        %d (retries included)\n", r.HTTPRequests)
	fmt.Fprintf(w, "events acknowledged  %d distinct\n", r.EventsAcked)
	fmt.Fprintf(w, "events in ledger     %d\n", r.EventsInLedger)
	fmt.Fprintf(w, "voids                %d acknowledged, %d in ledger (one event in %d voided after its 2xx, while its period is open)\n",
		r.VoidsAcked, r.VoidsInLedger, chaosVoidEvery)
	fmt.Fprintf(w, "rejected by reason   %s\n", formatCounts(r.Rejected))
	fmt.Fprintf(w, "responses            %s\n", formatCounts(r.Responses))
	fmt.Fprintf(w, "faults injected      %s\n", formatCounts(r.Faults))
	if len(r.Outages) > 0 {
		fmt.Fprintf(w, "database faults      %d, as the producers saw them:\n", len(r.Outages))
		writeList(w, r.Outages, 10)
	}
	fmt.Fprintf(w, "charges by status    %s\n", formatCounts(r.Charges))
	fmt.Fprintf(w, "charge lines         %d rated again from the events and matched to the cent: %s\n", r.LinesChecked(),
		formatCounts(r.Lines))
	fmt.Fprintf(w, "credits              %s checked (prepaid customers: one in ten)\n", formatCounts(r.Credits))
	fmt.Fprintf(w, "top-ups              %s\n", formatTopUps(r.TopUps))
	fmt.Fprintf(w, "payment intents      %d (%d of them top-ups')\n", r.PaymentIntents, r.TopUps["payment intents"])
	fmt.Fprintf(w, "violations           %d (expected 0)\n", len(r.Violations))
	writeList(w, r.Violations, 50)
	fmt.Fprintf(w, "%s\n", r.Line())
}

// writeList prints the first most items one a line ("  - item"), then how
// many it left out, if any.
func writeList(w io.Writer, items []string, most int) {
	for i, item := range items {
		if i == most {
			fmt.Fprintf(w, "  … %d more\n", len(items)-most)
			break
		}
		fmt.Fprintf(w, "  - %s\n", item)
	}
}

// formatCounts formats m as key=count pairs in key order, "-" when empty.
func formatCounts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := sortedKeys(m)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", strings.TrimSpace(k), m[k])
	}
	return strings.Join(parts, " ")
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
