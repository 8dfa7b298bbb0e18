package stripesim

import "net/http"

// routes returns every route of the simulator: the Stripe API surface and the control API.
func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()

	// Stripe API (authenticated with a bearer API key, Stripe's error shape).
	mux.Handle("POST /v1/payment_intents", s.stripeHandler(s.handlePaymentIntentCreate))
	mux.Handle("GET /v1/payment_intents", s.stripeHandler(s.handlePaymentIntentList))
	mux.Handle("GET /v1/payment_intents/{id}", s.stripeHandler(s.handlePaymentIntentRetrieve))
	mux.Handle("POST /v1/payment_intents/{id}/cancel", s.stripeHandler(s.handlePaymentIntentCancel))
	mux.Handle("POST /v1/refunds", s.stripeHandler(s.handleRefundCreate))
	mux.Handle("GET /v1/refunds", s.stripeHandler(s.handleRefundList))
	mux.Handle("GET /v1/refunds/{id}", s.stripeHandler(s.handleRefundRetrieve))
	mux.Handle("GET /v1/customers/{id}", s.stripeHandler(s.handleCustomerRetrieve))
	mux.Handle("/v1/", s.stripeHandler(s.handleUnrecognized))

	// Control API (JSON, unauthenticated: bind the simulator to loopback).
	mux.HandleFunc("GET /_sim/health", s.handleControlHealth)
	mux.HandleFunc("GET /_sim/faults", s.handleControlFaultList)
	mux.HandleFunc("POST /_sim/faults", s.handleControlFaultAdd)
	mux.HandleFunc("DELETE /_sim/faults", s.handleControlFaultClear)
	mux.HandleFunc("GET /_sim/clock", s.handleControlClockGet)
	mux.HandleFunc("POST /_sim/clock/advance", s.handleControlClockAdvance)
	mux.HandleFunc("POST /_sim/idempotency/expire", s.handleControlIdempotencyExpire)
	mux.HandleFunc("GET /_sim/payment_intents", s.handleControlPaymentIntentList)
	mux.HandleFunc("POST /_sim/payment_intents/{id}/settle", s.handleControlPaymentIntentSettle)
	mux.HandleFunc("PUT /_sim/customers/{id}", s.handleControlCustomerSet)
	mux.HandleFunc("GET /_sim/refunds", s.handleControlRefundList)
	mux.HandleFunc("POST /_sim/charges/{id}/refund", s.handleControlChargeRefund)
	mux.HandleFunc("POST /_sim/charges/{id}/dispute", s.handleControlChargeDispute)
	mux.HandleFunc("GET /_sim/events", s.handleControlEventList)
	mux.HandleFunc("POST /_sim/events/{id}/resend", s.handleControlEventResend)
	mux.HandleFunc("GET /_sim/webhooks", s.handleControlWebhookModeGet)
	mux.HandleFunc("POST /_sim/webhooks", s.handleControlWebhookModeSet)
	mux.HandleFunc("GET /_sim/stats", s.handleControlStats)
	mux.HandleFunc("POST /_sim/reset", s.handleControlReset)

	return mux
}
