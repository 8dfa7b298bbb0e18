// Package chaos proves Tally's whole promise at once, the way a payments team
// would before trusting it with money: the real binaries as separate
// processes (3 worker and 2 API replicas of cmd/server, cmd/stripesim), a
// private Postgres cluster it may restart, concurrent load with duplicates,
// conflicting re-posts and posts into closed periods, and faults everywhere —
// SIGKILLed replicas, Stripe latency past the timeout, stored 500s, dropped
// connections, 429 bursts, declines, a simulator clock jump past the key
// window, duplicated and reordered webhooks, terminated Postgres backends, a
// Postgres restart and late redrives. It then checks the result from the
// ledger's tables and the simulator's own record, independently of Tally's
// code, and reports.
//
// Everything runs on loopback, bounded in count and time, and stops by
// itself. cmd/chaos runs the long variant (make chaos); TestChaosShort the
// short one inside make test.
package chaos
