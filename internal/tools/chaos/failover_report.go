package chaos

import (
	"fmt"
	"io"
	"time"
)

// FailoverReport is what a failover drill did and found.
type FailoverReport struct {
	Seed      int64
	Mode      string // "async" or "sync" replication
	Engine    string // "proxies" (two clusters, the drill promotes) or "pg_auto_failover" (the monitor does)
	Customers int

	// Stall is how long replication was stalled before the kill, and
	// ReCloseAfter how long after the failover the lost closes were issued
	// again.
	Stall        time.Duration
	ReCloseAfter time.Duration

	// Duration is the whole drill's, Phases each phase's in order.
	Duration time.Duration
	Phases   []FailoverPhase

	// SlowCustomers is how many customers' first PaymentIntent creation was
	// made slower than Tally's Stripe timeout.
	SlowCustomers int

	// ClosesAckedInStall counts closes of the previous period answered 200
	// before the primary died; ClosesAfter those answered 200 when they
	// were issued again after the failover.
	ClosesAckedInStall int
	ClosesAfter        int

	// ChargesAtKill is the dying primary's charges by status just before
	// the kill; ChargesAfterPromote the promoted standby's, just after.
	ChargesAtKill       map[string]int
	ChargesAfterPromote map[string]int

	// PaymentIntentsAtKill counts the simulator's PaymentIntents at the kill.
	PaymentIntentsAtKill int

	// WALLostBytes is how much WAL the primary had written (a moment
	// before the kill) that the standby had not replayed when it was
	// promoted: at least this much was lost.
	WALLostBytes int64

	// FailoverTook is from the kill to the promoted standby reached by
	// Tally's URL: the app proxy's switch, or the monitor's promotion.
	FailoverTook time.Duration

	// EventsAcked counts distinct events acknowledged with a 2xx,
	// EventsAckedInStall those acknowledged during the stall (before the
	// kill), and EventsLost those acknowledged but missing from the
	// promoted ledger.
	EventsAcked        int
	EventsAckedInStall int
	EventsLost         int

	// Charges counts the final charges by status; HeldReasons counts the
	// held ones by the start of their reason (see heldReasonClass), and
	// HeldExamples holds one full reason of each.
	Charges      map[string]int
	HeldReasons  map[string]int
	HeldExamples map[string]string

	// PaymentIntents counts the simulator's PaymentIntents,
	// PaymentIntentsSucceeded the succeeded ones; StripeRequests counts the
	// simulator's requests by endpoint and outcome.
	PaymentIntents          int
	PaymentIntentsSucceeded int
	StripeRequests          map[string]map[string]int

	// DoubleCharged lists each (customer, period) with more than one
	// succeeded PaymentIntent, with their ids.
	DoubleCharged []string

	Violations []string
}

// FailoverPhase is one phase of the drill and how long it took.
type FailoverPhase struct {
	Name     string
	Duration time.Duration
}

// OK reports whether the drill found no violation.
func (r *FailoverReport) OK() bool { return len(r.Violations) == 0 }

// Line is the one-line summary of the drill.
func (r *FailoverReport) Line() string {
	return fmt.Sprintf("mode=%s seed=%d duration=%s customers=%d acked=%d lost=%d payment_intents=%d double_charged=%d charges=%s violations=%d",
		r.Mode, r.Seed, r.Duration.Round(time.Second), r.Customers, r.EventsAcked, r.EventsLost, r.PaymentIntents,
		len(r.DoubleCharged), formatCounts(r.Charges), len(r.Violations))
}

// Write prints the full report.
func (r *FailoverReport) Write(w io.Writer) {
	fmt.Fprintf(w, "\n=== failover report (%s replication, %s) ===\n", r.Mode, r.Engine)
	fmt.Fprintf(w, "seed                      %d\n", r.Seed)
	fmt.Fprintf(w, "duration                  %s\n", r.Duration.Round(time.Second))
	for _, p := range r.Phases {
		fmt.Fprintf(w, "  %-23s %s\n", p.Name, p.Duration.Round(100*time.Millisecond))
	}
	fmt.Fprintf(w, "customers                 %d (%d with a Stripe call slower than the timeout)\n", r.Customers, r.SlowCustomers)
	fmt.Fprintf(w, "replication stalled       %s, then primary killed (immediate) and standby promoted in %s\n",
		r.Stall, r.FailoverTook.Round(time.Millisecond))
	fmt.Fprintf(w, "WAL lost at the kill      %d bytes\n", r.WALLostBytes)
	fmt.Fprintf(w, "closes acked in stall     %d (issued again %s after the failover: %d acked)\n", r.ClosesAckedInStall,
		r.ReCloseAfter, r.ClosesAfter)
	fmt.Fprintf(w, "charges on the primary    %s (just before the kill)\n", formatCounts(r.ChargesAtKill))
	fmt.Fprintf(w, "charges on the standby    %s (just after promotion)\n", formatCounts(r.ChargesAfterPromote))
	fmt.Fprintf(w, "payment intents at kill   %d\n", r.PaymentIntentsAtKill)
	fmt.Fprintf(w, "events acknowledged       %d (%d during the stall)\n", r.EventsAcked, r.EventsAckedInStall)
	lostNote := "what asynchronous replication loses; not a violation"
	if r.Mode == "sync" {
		lostNote = "expected 0"
	}
	fmt.Fprintf(w, "acknowledged events lost  %d (%s)\n", r.EventsLost, lostNote)
	for _, e := range sortedKeys(r.StripeRequests) {
		fmt.Fprintf(w, "stripe %-18s %s\n", e, formatCounts(r.StripeRequests[e]))
	}
	fmt.Fprintf(w, "payment intents           %d (%d succeeded)\n", r.PaymentIntents, r.PaymentIntentsSucceeded)
	fmt.Fprintf(w, "charges by status         %s\n", formatCounts(r.Charges))
	fmt.Fprintf(w, "held reasons              %s\n", formatCounts(r.HeldReasons))
	for _, class := range sortedKeys(r.HeldExamples) {
		example := r.HeldExamples[class]
		if len(example) > 200 {
			example = example[:200] + "…"
		}
		fmt.Fprintf(w, "  e.g. %s\n", example)
	}
	fmt.Fprintf(w, "double charged            %d (customer/period with more than one succeeded PaymentIntent)\n", len(r.DoubleCharged))
	writeList(w, r.DoubleCharged, 20)
	fmt.Fprintf(w, "violations                %d (expected 0)\n", len(r.Violations))
	writeList(w, r.Violations, 50)
	fmt.Fprintf(w, "%s\n", r.Line())
}
