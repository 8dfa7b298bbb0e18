// Package api is Tally's HTTP interface: NewServer builds the handler, and
// routes.go lists every route in one place. Handlers decode and check the
// shape of requests, call internal/ledger for everything else, and answer
// JSON, with errors as RFC 9457 problem details. It never touches SQL.
package api
