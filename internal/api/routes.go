package api

import (
	"log/slog"
	"net/http"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/api/ingest"
	"github.com/tally-billing/tally/internal/ledger"
)

// addRoutes is the whole API surface. Each route names the scope it needs.
func addRoutes(mux *http.ServeMux, logger *slog.Logger, l *ledger.Ledger, ready ReadyFunc, webhookSecret string, o options) {
	auth := func(scope ledger.Scope, h http.Handler) http.Handler { return requireScope(logger, l, scope, h) }

	mux.Handle("GET /healthz", handleHealthz())
	mux.Handle("GET /readyz", handleReadyz(logger, ready))
	mux.Handle("GET /openapi.yaml", handleOpenAPIDocument())
	if o.riverUI != nil {
		mux.Handle("GET /riverui/login", requireAdminBasic(logger, l, handleRiverUILogin()))
		mux.Handle("PUT /riverui/api/queues/{name}/pause", requireAdminBasic(logger, l, requireSameOrigin(handleRiverUIQueuePause(o.riverUIQueues, o.riverUI))))
		mux.Handle("PUT /riverui/api/queues/{name}/resume", requireAdminBasic(logger, l, requireSameOrigin(handleRiverUIQueueResume(o.riverUIQueues, o.riverUI))))
		mux.Handle("/riverui/", requireAdminBasic(logger, l, requireSameOrigin(o.riverUI)))
	}
	if o.metrics != nil && o.metricsToken != "" {
		mux.Handle("GET /metrics", MetricsHandler(o.metrics, o.metricsToken))
	}

	mux.Handle("PUT /v1/customers/{customer_id}", auth(ledger.ScopeCustomersWrite, handleCustomerPut(logger, l)))
	mux.Handle("GET /v1/customers/{customer_id}", auth(ledger.ScopeBillingRead, handleCustomerGet(logger, l)))
	mux.Handle("GET /v1/customers/{customer_id}/usage", auth(ledger.ScopeBillingRead, handleCustomerUsage(logger, l)))
	mux.Handle("GET /v1/customers/{customer_id}/usage/series", auth(ledger.ScopeBillingRead, handleCustomerUsageSeries(logger, l)))
	mux.Handle("POST /v1/customers/{customer_id}/credit-grants", auth(ledger.ScopeAdmin, handleCreditGrantCreate(logger, l)))
	mux.Handle("POST /v1/customers/{customer_id}/credit-grants/{grant_id}/void", auth(ledger.ScopeAdmin, handleCreditGrantVoid(logger, l)))
	mux.Handle("GET /v1/customers/{customer_id}/credits", auth(ledger.ScopeBillingRead, handleCustomerCredits(logger, l)))
	mux.Handle("POST /v1/customers/{customer_id}/top-ups", auth(ledger.ScopeAdmin, handleTopUpCreate(logger, l)))
	mux.Handle("GET /v1/customers/{customer_id}/top-ups", auth(ledger.ScopeBillingRead, handleTopUpList(logger, l)))
	mux.Handle("GET /v1/customers/{customer_id}/top-ups/{top_up_id}", auth(ledger.ScopeBillingRead, handleTopUpGet(logger, l)))
	mux.Handle("POST /v1/customers/{customer_id}/top-ups/{top_up_id}/cancel", auth(ledger.ScopeAdmin, handleTopUpCancel(logger, l)))
	mux.Handle("GET /v1/customers/{customer_id}/periods", auth(ledger.ScopeBillingRead, handlePeriodList(logger, l)))
	mux.Handle("GET /v1/customers/{customer_id}/periods/{period}", auth(ledger.ScopeBillingRead, handlePeriodGet(logger, l)))

	mux.Handle("POST /v1/customers/{customer_id}/periods/{period}/close", auth(ledger.ScopeAdmin, handlePeriodClose(logger, l)))

	mux.Handle("PUT /v1/plans/{plan_id}", auth(ledger.ScopeAdmin, handlePlanPut(logger, l)))
	mux.Handle("GET /v1/plans/{plan_id}", auth(ledger.ScopeBillingRead, handlePlanGet(logger, l)))
	mux.Handle("GET /v1/plans", auth(ledger.ScopeBillingRead, handlePlanList(logger, l)))

	mux.Handle("GET /v1/charges", auth(ledger.ScopeBillingRead, handleChargeList(logger, l)))
	mux.Handle("GET /v1/charges/{id}", auth(ledger.ScopeBillingRead, handleChargeGet(logger, l)))
	mux.Handle("GET /v1/charges/{id}/statement", auth(ledger.ScopeBillingRead, handleChargeStatement(logger, l)))
	mux.Handle("POST /v1/charges/{id}/approve", auth(ledger.ScopeAdmin, handleChargeApprove(logger, l)))
	mux.Handle("POST /v1/charges/{id}/retry", auth(ledger.ScopeAdmin, handleChargeRetry(logger, l)))
	mux.Handle("POST /v1/charges/{id}/cancel", auth(ledger.ScopeAdmin, handleChargeCancel(logger, l)))
	mux.Handle("POST /v1/charges/{id}/resolve", auth(ledger.ScopeAdmin, handleChargeResolve(logger, l)))

	mux.Handle("GET /v1/admin/charging", auth(ledger.ScopeAdmin, handleChargingGet(logger, l)))
	mux.Handle("POST /v1/admin/charging/pause", auth(ledger.ScopeAdmin, handleChargingPause(logger, l)))
	mux.Handle("POST /v1/admin/charging/resume", auth(ledger.ScopeAdmin, handleChargingResume(logger, l)))

	mux.Handle("POST /v1/webhook-endpoints", auth(ledger.ScopeAdmin, handleWebhookEndpointCreate(logger, l)))
	mux.Handle("GET /v1/webhook-endpoints", auth(ledger.ScopeAdmin, handleWebhookEndpointList(logger, l)))
	mux.Handle("DELETE /v1/webhook-endpoints/{id}", auth(ledger.ScopeAdmin, handleWebhookEndpointDelete(logger, l)))
	mux.Handle("POST /v1/webhook-endpoints/{id}/rotate-secret", auth(ledger.ScopeAdmin, handleWebhookEndpointRotateSecret(logger, l)))

	mux.Handle("POST /v1/usage-events", auth(ledger.ScopeUsageWrite, ingest.UsageEventCreate(logger, o.metrics, l.UsageEventRecord)))
	mux.Handle("POST /v1/usage-events/batch", auth(ledger.ScopeUsageWrite, ingest.UsageEventBatch(logger, o.metrics, l.UsageEventRecordBatch, l.UsageEventCheckBatch)))
	mux.Handle("POST /v1/usage-events/void", auth(ledger.ScopeUsageWrite, ingest.UsageEventVoid(logger, actorFrom, l.UsageEventVoid)))

	mux.Handle("POST /v1/stripe/webhooks", ingest.StripeWebhook(logger, l.StripeEventRecord, webhookSecret))

	mux.Handle("/", handleNotFound(logger))
}

func handleNotFound(logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpjson.WriteProblem(w, r, httpjson.Problem{Status: http.StatusNotFound, Code: "not_found",
			Detail: "no route for " + r.Method + " " + r.URL.Path})
	})
}
