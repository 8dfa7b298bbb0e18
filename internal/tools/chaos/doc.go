// Package chaos proves Tally's whole promise at once, the way a payments team
// would before trusting it with money: the real binaries as separate
// processes (3 worker and 2 API replicas of cmd/server, cmd/stripesim), a
// private Postgres cluster it may restart, concurrent load with duplicates,
// conflicting re-posts and posts into closed periods, and faults everywhere —
// SIGKILLed replicas, Stripe latency past the timeout, stored 500s, dropped
// connections, 429 bursts, declines, a simulator clock jump past the key
// window, duplicated and reordered webhooks, terminated Postgres backends, a
// Postgres restart and late redrives. A third of the customers are on a
// tiered plan (graduated, volume and package prices; a second version
// mid-run) and send quantity events; about one acknowledged event in 20 is
// voided right after its 2xx. One customer in ten is prepaid (credit
// grants, some expiring); a third of those also buy top-ups through the
// API, posted as a client that retries after a timeout would, and a third
// have an automatic recharge that the closes start (topups.go); their
// Stripe calls meet declines, stored 500s, dropped connections, latency and
// a webhook outage. It then checks the result from the ledger's tables and
// the simulator's own record, independently of Tally's code — every charge
// line is rated again with this package's own rating (rating.go,
// lines_check.go) from the events not voided, the voids in the ledger are
// exactly those acknowledged (or whose answer was lost), every top-up was
// bought at most once on Stripe with one grant per success, Stripe's total
// per customer is the ledger's charges plus top-ups, and each recharge
// happened once per crossing of its threshold (topups_check.go) — and
// reports.
//
// The failover drill (RunFailover, failover.go) proves the promise across
// a database failover. A primary streams to a standby through a pausable
// TCP proxy (tcpproxy.go, replica.go); every Tally process reaches the
// database through a second proxy that can switch targets. With replication
// stalled, every customer's period is closed and charged — the first
// PaymentIntent creation of each moves the money and answers 500, a few
// are slower than the timeout — while producers post new events; then the
// primary is killed (pg_ctl stop -m immediate), the standby promoted and
// the app proxy switched to it. Tally has forgotten what it sent to Stripe
// in the lost window; the simulator keeps an idempotency key only a little
// longer than Tally's key window. After closing everything again and
// waiting for quiescence, the drill checks from the ledger and the
// simulator that no (customer, period) has two succeeded PaymentIntents,
// that every charge is settled and names its PaymentIntent, and counts the
// acknowledged events the failover lost — a violation only when the
// replication was synchronous.
//
// Everything runs on loopback, bounded in count and time, and stops by
// itself. tools/chaos runs the long variants (make chaos, make failover);
// TestChaosShort and TestFailoverShort the short ones inside make test.
package chaos
