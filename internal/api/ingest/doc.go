// Package ingest serves what strangers post to Tally: usage events, one
// (UsageEventCreate) or a batch (UsageEventBatch), their voids
// (UsageEventVoid), and Stripe's webhooks
// (StripeWebhook). Each handler decodes and checks a request with
// internal/api/httpjson and passes it on to a ledger function it is given,
// so its fuzz targets serve the real handlers with the ledger stubbed: no
// database, and a test binary that imports little (no package api, no
// OpenAPI validator, no River). internal/api routes the handlers.
package ingest
