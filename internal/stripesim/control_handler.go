package stripesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"time"
)

// controlError is the control API's error body: {"error": "message"}.
type controlError struct {
	Error string `json:"error"`
}

// clockWire is the control API's clock shape.
type clockWire struct {
	Now           time.Time `json:"now"`
	Unix          int64     `json:"unix"`
	OffsetSeconds float64   `json:"offset_seconds"`
}

// listWire wraps control API lists: {"data": [...]}.
type listWire[T any] struct {
	Data []T `json:"data"`
}

func (s *Server) controlWriteError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, ErrConflict):
		status = http.StatusConflict
	case errors.Is(err, ErrInvalid):
		status = http.StatusBadRequest
	}
	if status == http.StatusInternalServerError {
		s.logger.Error("control request failed", "error", err.Error())
	}
	s.writeJSON(w, status, controlError{Error: err.Error()})
}

// controlDecode decodes a JSON body into dst, rejecting unknown fields and trailing data. An
// empty body leaves dst untouched when allowEmpty is set.
func controlDecode(w http.ResponseWriter, r *http.Request, dst any, allowEmpty bool) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, formBodyLimit))
	if err != nil {
		return errorf(ErrInvalid, "reading body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil
		}
		return errorf(ErrInvalid, "a JSON body is required")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return errorf(ErrInvalid, "decoding JSON body: %v", err)
	}
	if dec.More() {
		return errorf(ErrInvalid, "unexpected data after the JSON body")
	}
	return nil
}

func (s *Server) handleControlHealth(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

func (s *Server) handleControlFaultList(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, listWire[Fault]{Data: s.FaultList()})
}

func (s *Server) handleControlFaultAdd(w http.ResponseWriter, r *http.Request) {
	var f Fault
	if err := controlDecode(w, r, &f, false); err != nil {
		s.controlWriteError(w, err)
		return
	}
	if err := s.FaultAdd(f); err != nil {
		s.controlWriteError(w, err)
		return
	}
	s.writeJSON(w, http.StatusOK, listWire[Fault]{Data: s.FaultList()})
}

func (s *Server) handleControlFaultClear(w http.ResponseWriter, _ *http.Request) {
	s.FaultClear()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) clockWire() clockWire {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	return clockWire{Now: now.UTC(), Unix: now.Unix(), OffsetSeconds: s.clockOffset.Seconds()}
}

func (s *Server) handleControlClockGet(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, s.clockWire())
}

func (s *Server) handleControlClockAdvance(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Seconds *float64 `json:"seconds"`
	}
	if err := controlDecode(w, r, &req, false); err != nil {
		s.controlWriteError(w, err)
		return
	}
	if req.Seconds == nil || math.IsNaN(*req.Seconds) || math.IsInf(*req.Seconds, 0) || *req.Seconds > 100*365*24*3600 {
		s.controlWriteError(w, errorf(ErrInvalid, `"seconds" is required: a number of seconds >= 0`))
		return
	}
	if _, err := s.ClockAdvance(time.Duration(*req.Seconds * float64(time.Second))); err != nil {
		s.controlWriteError(w, err)
		return
	}
	s.writeJSON(w, http.StatusOK, s.clockWire())
}

func (s *Server) handleControlIdempotencyExpire(w http.ResponseWriter, r *http.Request) {
	var req struct {
		OlderThanSeconds *float64 `json:"older_than_seconds"`
	}
	if err := controlDecode(w, r, &req, false); err != nil {
		s.controlWriteError(w, err)
		return
	}
	if req.OlderThanSeconds == nil || *req.OlderThanSeconds < 0 || math.IsNaN(*req.OlderThanSeconds) || math.IsInf(*req.OlderThanSeconds, 0) {
		s.controlWriteError(w, errorf(ErrInvalid, `"older_than_seconds" is required: a number of seconds >= 0`))
		return
	}
	n := s.IdempotencyExpire(time.Duration(*req.OlderThanSeconds * float64(time.Second)))
	s.writeJSON(w, http.StatusOK, map[string]int{"expired": n})
}

func (s *Server) handleControlPaymentIntentList(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	body := mustJSON(listWire[*paymentIntent]{Data: append([]*paymentIntent{}, s.paymentIntents...)})
	s.mu.Unlock()
	s.writeJSONBytes(w, http.StatusOK, body)
}

func (s *Server) handleControlPaymentIntentSettle(w http.ResponseWriter, r *http.Request) {
	var params PaymentIntentSettleParams
	if err := controlDecode(w, r, &params, false); err != nil {
		s.controlWriteError(w, err)
		return
	}
	body, err := s.paymentIntentSettle(r.PathValue("id"), params)
	if err != nil {
		s.controlWriteError(w, err)
		return
	}
	s.writeJSONBytes(w, http.StatusOK, body)
}

func (s *Server) handleControlCustomerSet(w http.ResponseWriter, r *http.Request) {
	var req map[string]json.RawMessage
	if err := controlDecode(w, r, &req, false); err != nil {
		s.controlWriteError(w, err)
		return
	}
	raw, ok := req["default_payment_method"]
	if !ok || len(req) != 1 {
		s.controlWriteError(w, errorf(ErrInvalid, `body must be {"default_payment_method": "pm_…" | null}`))
		return
	}
	var pm *string
	if err := json.Unmarshal(raw, &pm); err != nil {
		s.controlWriteError(w, errorf(ErrInvalid, "default_payment_method must be a string or null: %v", err))
		return
	}
	if pm != nil && *pm == "" {
		s.controlWriteError(w, errorf(ErrInvalid, "default_payment_method must not be empty; use null for none"))
		return
	}
	body, err := s.customerSetDefaultPaymentMethod(r.PathValue("id"), derefString(pm))
	if err != nil {
		s.controlWriteError(w, err)
		return
	}
	s.writeJSONBytes(w, http.StatusOK, body)
}

func (s *Server) handleControlRefundList(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	body := mustJSON(listWire[*refund]{Data: append([]*refund{}, s.refunds...)})
	s.mu.Unlock()
	s.writeJSONBytes(w, http.StatusOK, body)
}

func (s *Server) handleControlChargeRefund(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Amount int64 `json:"amount"`
	}
	if err := controlDecode(w, r, &req, true); err != nil {
		s.controlWriteError(w, err)
		return
	}
	body, err := s.chargeRefund(r.PathValue("id"), req.Amount)
	if err != nil {
		s.controlWriteError(w, err)
		return
	}
	s.writeJSONBytes(w, http.StatusOK, body)
}

func (s *Server) handleControlChargeDispute(w http.ResponseWriter, r *http.Request) {
	var req struct{}
	if err := controlDecode(w, r, &req, true); err != nil {
		s.controlWriteError(w, err)
		return
	}
	body, err := s.chargeDispute(r.PathValue("id"))
	if err != nil {
		s.controlWriteError(w, err)
		return
	}
	s.writeJSONBytes(w, http.StatusOK, body)
}

func (s *Server) handleControlEventList(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, listWire[Event]{Data: eventTypeFilter(s.EventList(), r)})
}

func (s *Server) handleControlEventResend(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.EventResend(id); err != nil {
		s.controlWriteError(w, err)
		return
	}
	s.writeJSON(w, http.StatusAccepted, map[string]string{"id": id, "status": "queued"})
}

func (s *Server) handleControlWebhookModeGet(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, s.WebhookModeGet())
}

func (s *Server) handleControlWebhookModeSet(w http.ResponseWriter, r *http.Request) {
	var mode WebhookMode
	if err := controlDecode(w, r, &mode, false); err != nil {
		s.controlWriteError(w, err)
		return
	}
	got, err := s.WebhookModeSet(mode)
	if err != nil {
		s.controlWriteError(w, err)
		return
	}
	s.writeJSON(w, http.StatusOK, got)
}

func (s *Server) handleControlStats(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, s.Stats())
}

func (s *Server) handleControlReset(w http.ResponseWriter, _ *http.Request) {
	s.Reset()
	w.WriteHeader(http.StatusNoContent)
}
