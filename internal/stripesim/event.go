package stripesim

import (
	"encoding/json"
	"net/http"
)

// Event types the simulator emits.
const (
	eventTypeChargeDisputeCreated        = "charge.dispute.created"
	eventTypeChargeRefunded              = "charge.refunded"
	eventTypePaymentIntentCanceled       = "payment_intent.canceled"
	eventTypePaymentIntentPaymentFailed  = "payment_intent.payment_failed"
	eventTypePaymentIntentProcessing     = "payment_intent.processing"
	eventTypePaymentIntentRequiresAction = "payment_intent.requires_action"
	eventTypePaymentIntentSucceeded      = "payment_intent.succeeded"
	eventTypeRefundCreated               = "refund.created"
)

// Event is one event the simulator generated, with the exact payload it delivers and its
// delivery state.
type Event struct {
	// ID is the event id ("evt_…"); duplicates and resends carry the same id.
	ID string `json:"id"`

	// Type is the event type, e.g. "payment_intent.succeeded".
	Type string `json:"type"`

	// Created is the event's creation time on the simulator's clock (Unix seconds).
	Created int64 `json:"created"`

	// ObjectID is the id of data.object (PaymentIntent, Charge, Refund or Dispute).
	ObjectID string `json:"object_id"`

	// Payload is the event JSON exactly as delivered (and signed). Decode it into a
	// stripe.Event.
	Payload json.RawMessage `json:"payload"`

	// DeliveryAttempts counts HTTP attempts across every copy (duplicates, retries, resends).
	DeliveryAttempts int `json:"delivery_attempts"`

	// Delivered reports whether at least one attempt got a 2xx answer.
	Delivered bool `json:"delivered"`

	// LastDeliveryError describes the last failed attempt, if any.
	LastDeliveryError string `json:"last_delivery_error,omitempty"`
}

type eventRequestWire struct {
	ID             *string `json:"id"`
	IdempotencyKey *string `json:"idempotency_key"`
}

type eventDataWire struct {
	Object json.RawMessage `json:"object"`
}

type eventWire struct {
	ID              string           `json:"id"`
	Object          string           `json:"object"`
	APIVersion      string           `json:"api_version"`
	Created         int64            `json:"created"`
	Data            eventDataWire    `json:"data"`
	Livemode        bool             `json:"livemode"`
	PendingWebhooks int              `json:"pending_webhooks"`
	Request         eventRequestWire `json:"request"`
	Type            string           `json:"type"`
}

// eventEmitLocked records an event whose data.object is a snapshot of object now, and queues
// its delivery (plus the configured duplicates) when a webhook URL is set. requestID and
// idempotencyKey are empty for events not caused by an API request. s.mu must be held.
func (s *Server) eventEmitLocked(eventType string, object any, requestID, idempotencyKey string) {
	objectJSON := mustJSON(object)
	var idHolder struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(objectJSON, &idHolder)

	ev := &Event{
		ID:       idEvent(),
		Type:     eventType,
		Created:  s.nowLocked().Unix(),
		ObjectID: idHolder.ID,
	}
	ev.Payload = mustJSON(eventWire{
		ID:              ev.ID,
		Object:          "event",
		APIVersion:      APIVersion,
		Created:         ev.Created,
		Data:            eventDataWire{Object: objectJSON},
		PendingWebhooks: 1,
		Request:         eventRequestWire{ID: stringOrNil(requestID), IdempotencyKey: stringOrNil(idempotencyKey)},
		Type:            eventType,
	})
	s.events = append(s.events, ev)
	s.eventsByID[ev.ID] = ev
	s.stats.EventsCreated++
	s.logger.Debug("event created", "event_id", ev.ID, "type", eventType, "object_id", ev.ObjectID)

	if s.webhookMode.URL == "" {
		return
	}
	for range 1 + s.webhookMode.Duplicate {
		s.webhookEnqueueLocked(ev, s.webhookMode.URL)
	}
}

// EventList returns every event generated since the last Reset, oldest first.
func (s *Server) EventList() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Event, len(s.events))
	for i, ev := range s.events {
		out[i] = *ev
	}
	return out
}

// EventResend queues one more delivery of the event to the current webhook URL (duplicate mode
// does not apply). It returns an error wrapping ErrNotFound for an unknown event and one
// wrapping ErrConflict when no webhook URL is configured.
func (s *Server) EventResend(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev, ok := s.eventsByID[id]
	if !ok {
		return errorf(ErrNotFound, "no such event: %q", id)
	}
	if s.webhookMode.URL == "" {
		return errorf(ErrConflict, "no webhook URL configured")
	}
	s.webhookEnqueueLocked(ev, s.webhookMode.URL)
	s.logger.Info("event resent", "event_id", id)
	return nil
}

// eventTypeFilter is used by the control API's GET /_sim/events?type=….
func eventTypeFilter(events []Event, r *http.Request) []Event {
	want := r.URL.Query().Get("type")
	if want == "" {
		return events
	}
	out := make([]Event, 0, len(events))
	for _, ev := range events {
		if ev.Type == want {
			out = append(out, ev)
		}
	}
	return out
}
