// Package stripesim is an in-memory, Stripe-compatible simulator of the small part of the Stripe
// API that Tally uses, with fault injection, a controllable clock and signed webhooks.
//
// The simulator answers the real stripe-go client: create, retrieve and list PaymentIntents and
// Refunds (creation with Stripe's idempotency-key semantics: stored results including stored
// errors, parameter mismatch, concurrent use, retention window) and retrieve Customers. A
// control API under /_sim/ (and the same operations as methods on *Server, or through
// ControlClient from another process) injects faults per Stripe customer, advances the clock,
// settles asynchronous payments, refunds and disputes charges, shapes webhook delivery and
// exposes every PaymentIntent and refund ever created so tests can assert "charged exactly
// once" and "refunded exactly once".
//
// This package is for development, demos and tests only. It keeps everything in memory, never
// talks to Stripe and must not be imported by production code paths (api, jobs, ledger); those
// reach it only through a Stripe base URL.
package stripesim
