// Package ledger is Tally's domain: customers, billing periods, the
// append-only usage ledger, API keys, and every money operation with the SQL
// that runs it. It never imports net/http; internal/api and internal/jobs
// call into it, never the other way round.
//
// Exported methods open and commit their own transaction unless their name
// ends in Tx, in which case they run in the caller's. Every transaction takes
// one `now` from Config.Clock, so tests control time.
package ledger
