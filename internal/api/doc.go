// Package api is Tally's HTTP interface: NewServer builds the handler, and
// routes.go lists every route in one place. Handlers decode and check the
// shape of requests, call internal/ledger for everything else, and answer
// JSON, with errors as RFC 9457 problem details. It never touches SQL.
//
// Two packages below it hold what is not tied to the server: httpjson, the
// JSON wire format (strict decoding, answers, problem details, the mapping
// of the ledger's errors, request ids), and ingest, the handlers of what
// strangers post (usage events, Stripe's webhooks) with their fuzz targets.
// Neither imports api; api routes ingest's handlers.
package api
