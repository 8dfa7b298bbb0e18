package api

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/tally-billing/tally/internal/api/httpjson"
	"github.com/tally-billing/tally/internal/ledger"
)

// Outbound webhook endpoints (admin): where Tally posts the notifications a
// producer subscribes to, signed with the endpoint's secret.

// webhookEndpointResponse is an endpoint as the API shows it. Secret is
// shown only by its creation and a rotation.
type webhookEndpointResponse struct {
	ID                      int64      `json:"id"`
	URL                     string     `json:"url"`
	Events                  []string   `json:"events"`
	Description             string     `json:"description"`
	Secret                  *string    `json:"secret,omitempty"`
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	DisabledAt              *time.Time `json:"disabled_at"`
	DisabledReason          *string    `json:"disabled_reason"`
	CreatedAt               time.Time  `json:"created_at"`
	UpdatedAt               time.Time  `json:"updated_at"`
}

func newWebhookEndpointResponse(e *ledger.WebhookEndpoint, withSecret bool) webhookEndpointResponse {
	resp := webhookEndpointResponse{ID: e.ID, URL: e.URL, Events: e.Events, Description: e.Description,
		PreviousSecretExpiresAt: e.PreviousSecretUntil, DisabledAt: e.DisabledAt, DisabledReason: e.DisabledReason,
		CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt}
	if withSecret {
		resp.Secret = &e.Secret
	}
	return resp
}

// handleWebhookEndpointCreate registers {"url", "events", "description"} and
// answers 201 with the endpoint and its signing secret, shown this once.
func handleWebhookEndpointCreate(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type request struct {
		URL         string   `json:"url"`
		Events      []string `json:"events"`
		Description string   `json:"description"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		e, err := l.WebhookEndpointCreate(r.Context(), ledger.WebhookEndpointCreateParams{
			URL: req.URL, Events: req.Events, Description: req.Description,
		})
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusCreated, newWebhookEndpointResponse(e, true))
	})
}

// handleWebhookEndpointList lists the endpoints, oldest first, without their
// secrets.
func handleWebhookEndpointList(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type response struct {
		Data []webhookEndpointResponse `json:"data"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		list, err := l.WebhookEndpointList(r.Context())
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		resp := response{Data: make([]webhookEndpointResponse, 0, len(list))}
		for _, e := range list {
			resp.Data = append(resp.Data, newWebhookEndpointResponse(e, false))
		}
		httpjson.Encode(w, http.StatusOK, resp)
	})
}

// handleWebhookEndpointDelete deletes an endpoint: 204, or 404. Its pending
// deliveries are canceled.
func handleWebhookEndpointDelete(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r, "webhook endpoint")
		if err == nil {
			err = l.WebhookEndpointDelete(r.Context(), id)
		}
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// handleWebhookEndpointRotateSecret gives an endpoint a new secret, answered once;
// the previous one keeps signing for {"grace_period_seconds"} (default a
// day, at most a week; 0 ends it at once).
func handleWebhookEndpointRotateSecret(logger *slog.Logger, l *ledger.Ledger) http.Handler {
	type request struct {
		GracePeriodSeconds *int64 `json:"grace_period_seconds"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r, "webhook endpoint")
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		req, err := httpjson.Decode[request](w, r, httpjson.BodyLimitDefault)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		grace := ledger.WebhookSecretGraceDefault
		if g := req.GracePeriodSeconds; g != nil {
			grace = -1 // out of range (and never overflowing): the ledger refuses it, naming the field
			if *g >= 0 && *g <= int64(ledger.WebhookSecretGraceMax/time.Second) {
				grace = time.Duration(*g) * time.Second
			}
		}
		e, err := l.WebhookEndpointRotateSecret(r.Context(), id, grace)
		if err != nil {
			httpjson.WriteError(logger, w, r, err)
			return
		}
		httpjson.Encode(w, http.StatusOK, newWebhookEndpointResponse(e, true))
	})
}
