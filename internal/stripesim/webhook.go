package stripesim

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// WebhookDuplicateMax bounds WebhookMode.Duplicate.
const WebhookDuplicateMax = 10

// WebhookReorderWindowDefault is the default for WebhookMode.ReorderWindow.
const WebhookReorderWindowDefault = 4

// WebhookReorderFlushDefault is the default for WebhookMode.ReorderFlush.
const WebhookReorderFlushDefault = 200 * time.Millisecond

// WebhookMode shapes webhook delivery. Its zero value delivers each event once, in order,
// without delay.
type WebhookMode struct {
	// URL is where events are delivered. In WebhookModeSet an empty URL keeps the current one
	// (initially Config.WebhookURL).
	URL string

	// Duplicate sends every new event this many extra times, with the same event id and
	// payload, as Stripe occasionally does. At most WebhookDuplicateMax.
	Duplicate int

	// Delay waits this long before the first attempt of each delivery. On the wire it is
	// delay_ms.
	Delay time.Duration

	// Reorder buffers up to ReorderWindow deliveries (or whatever arrived within ReorderFlush
	// of the first buffered one) and sends them in shuffled order, never in the original order
	// when there are two or more.
	Reorder bool

	// ReorderWindow is the reorder buffer size; 0 means WebhookReorderWindowDefault.
	ReorderWindow int

	// ReorderFlush is how long a partly filled reorder buffer waits for more deliveries before
	// it is sent anyway; 0 means WebhookReorderFlushDefault. On the wire it is
	// reorder_flush_ms.
	ReorderFlush time.Duration
}

type webhookModeJSON struct {
	URL            string `json:"url,omitempty"`
	Duplicate      int    `json:"duplicate"`
	DelayMS        int64  `json:"delay_ms"`
	Reorder        bool   `json:"reorder"`
	ReorderWindow  int    `json:"reorder_window,omitempty"`
	ReorderFlushMS int64  `json:"reorder_flush_ms,omitempty"`
}

// MarshalJSON renders the mode in the control API's shape
// ({"url","duplicate","delay_ms","reorder","reorder_window","reorder_flush_ms"}).
func (m WebhookMode) MarshalJSON() ([]byte, error) {
	return json.Marshal(webhookModeJSON{
		URL:            m.URL,
		Duplicate:      m.Duplicate,
		DelayMS:        m.Delay.Milliseconds(),
		Reorder:        m.Reorder,
		ReorderWindow:  m.ReorderWindow,
		ReorderFlushMS: m.ReorderFlush.Milliseconds(),
	})
}

// UnmarshalJSON parses the control API's shape; unknown fields are an error.
func (m *WebhookMode) UnmarshalJSON(data []byte) error {
	var v webhookModeJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	*m = WebhookMode{
		URL:           v.URL,
		Duplicate:     v.Duplicate,
		Delay:         time.Duration(v.DelayMS) * time.Millisecond,
		Reorder:       v.Reorder,
		ReorderWindow: v.ReorderWindow,
		ReorderFlush:  time.Duration(v.ReorderFlushMS) * time.Millisecond,
	}
	return nil
}

// WebhookModeSet replaces the delivery mode (an empty URL keeps the current URL) and returns
// the mode now in effect. It applies to deliveries queued from now on, and the delay and
// reordering also to those still queued. It returns an error wrapping ErrInvalid for a
// negative or too large Duplicate, a negative Delay or ReorderFlush, or a ReorderWindow outside
// 0..100.
func (s *Server) WebhookModeSet(mode WebhookMode) (WebhookMode, error) {
	if mode.Duplicate < 0 || mode.Duplicate > WebhookDuplicateMax {
		return WebhookMode{}, errorf(ErrInvalid, "duplicate must be between 0 and %d, got %d", WebhookDuplicateMax, mode.Duplicate)
	}
	if mode.Delay < 0 {
		return WebhookMode{}, errorf(ErrInvalid, "delay must be >= 0, got %s", mode.Delay)
	}
	if mode.ReorderFlush < 0 {
		return WebhookMode{}, errorf(ErrInvalid, "reorder_flush must be >= 0, got %s", mode.ReorderFlush)
	}
	if mode.ReorderWindow < 0 || mode.ReorderWindow > 100 {
		return WebhookMode{}, errorf(ErrInvalid, "reorder_window must be between 0 and 100, got %d", mode.ReorderWindow)
	}
	if mode.ReorderWindow == 0 {
		mode.ReorderWindow = WebhookReorderWindowDefault
	}
	if mode.ReorderFlush == 0 {
		mode.ReorderFlush = WebhookReorderFlushDefault
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if mode.URL == "" {
		mode.URL = s.webhookMode.URL
	}
	s.webhookMode = mode
	s.logger.Info("webhook mode set", "url", mode.URL, "duplicate", mode.Duplicate,
		"delay_ms", mode.Delay.Milliseconds(), "reorder", mode.Reorder, "reorder_window", mode.ReorderWindow,
		"reorder_flush_ms", mode.ReorderFlush.Milliseconds())
	return mode, nil
}

// WebhookModeGet returns the delivery mode in effect.
func (s *Server) WebhookModeGet() WebhookMode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.webhookMode
}

// webhookSignatureHeader returns the Stripe-Signature header for payload signed at t with
// secret: "t=<unix>,v1=<hex HMAC-SHA256 of "<unix>.<payload>">", what stripe-go's webhook
// package verifies.
func webhookSignatureHeader(payload []byte, secret string, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(payload)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// webhookDelivery is one copy of an event on its way to the endpoint.
type webhookDelivery struct {
	eventID string
	payload []byte
	url     string
}

// webhookStart starts the dispatcher (reordering) and the delivery worker. Close stops them.
func (s *Server) webhookStart() {
	ctx, cancel := context.WithCancel(context.Background())
	s.webhookCtx, s.webhookCancel = ctx, cancel
	s.webhookIncoming = make(chan webhookDelivery, s.cfg.WebhookQueueSize)
	s.webhookWork = make(chan webhookDelivery)
	s.webhookWG.Add(2)
	go s.webhookDispatch(ctx)
	go s.webhookWorker(ctx)
}

// webhookEnqueueLocked queues one delivery without blocking; a full queue drops it. s.mu must
// be held.
func (s *Server) webhookEnqueueLocked(ev *Event, url string) {
	if s.webhookCtx.Err() != nil {
		return
	}
	select {
	case s.webhookIncoming <- webhookDelivery{eventID: ev.ID, payload: ev.Payload, url: url}:
	default:
		s.stats.WebhookDropped++
		s.logger.Warn("webhook queue full; delivery dropped (resend it with POST /_sim/events/{id}/resend)",
			"event_id", ev.ID, "type", ev.Type)
	}
}

// webhookDispatch moves deliveries from the queue to the worker, shuffling them in reorder
// mode.
func (s *Server) webhookDispatch(ctx context.Context) {
	defer s.webhookWG.Done()
	var (
		buf    []webhookDelivery
		timer  *time.Timer
		flushC <-chan time.Time
	)
	forward := func(d webhookDelivery) bool {
		select {
		case s.webhookWork <- d:
			return true
		case <-ctx.Done():
			return false
		}
	}
	flush := func() bool {
		if timer != nil {
			timer.Stop()
			timer, flushC = nil, nil
		}
		shuffled := webhookShuffle(buf)
		buf = nil
		for _, d := range shuffled {
			if !forward(d) {
				return false
			}
		}
		return true
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-flushC:
			if !flush() {
				return
			}
		case d := <-s.webhookIncoming:
			mode := s.WebhookModeGet()
			if !mode.Reorder {
				if len(buf) > 0 && !flush() {
					return
				}
				if !forward(d) {
					return
				}
				continue
			}
			buf = append(buf, d)
			if len(buf) >= max(mode.ReorderWindow, 1) {
				if !flush() {
					return
				}
			} else if timer == nil {
				timer = time.NewTimer(mode.ReorderFlush)
				flushC = timer.C
			}
		}
	}
}

// webhookShuffle returns the deliveries in a random order that differs from the given one
// whenever there are at least two.
func webhookShuffle(in []webhookDelivery) []webhookDelivery {
	if len(in) < 2 {
		return in
	}
	perm := rand.Perm(len(in))
	identity := true
	for i, p := range perm {
		if i != p {
			identity = false
			break
		}
	}
	if identity {
		perm = append(perm[1:], perm[0])
	}
	out := make([]webhookDelivery, len(in))
	for i, p := range perm {
		out[i] = in[p]
	}
	return out
}

func (s *Server) webhookWorker(ctx context.Context) {
	defer s.webhookWG.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-s.webhookWork:
			s.webhookDeliver(ctx, d)
		}
	}
}

// webhookDeliver sends one delivery, retrying non-2xx answers and transport errors with
// exponential backoff up to Config.WebhookMaxAttempts attempts.
func (s *Server) webhookDeliver(ctx context.Context, d webhookDelivery) {
	if delay := s.WebhookModeGet().Delay; delay > 0 && !sleepCtx(ctx, delay) {
		return
	}
	backoff := s.cfg.WebhookRetryBackoff
	for attempt := 1; ; attempt++ {
		status, err := s.webhookSend(ctx, d)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		s.stats.WebhookAttempts++
		ev := s.eventsByID[d.eventID]
		if ev != nil {
			ev.DeliveryAttempts++
		}
		if err == nil {
			s.stats.WebhookDelivered++
			if ev != nil {
				ev.Delivered = true
			}
		} else if ev != nil {
			ev.LastDeliveryError = err.Error()
		}
		giveUp := err != nil && attempt >= s.cfg.WebhookMaxAttempts
		if giveUp {
			s.stats.WebhookFailed++
		}
		s.mu.Unlock()

		if err == nil {
			s.logger.Debug("webhook delivered", "event_id", d.eventID, "status", status, "attempt", attempt)
			return
		}
		if giveUp {
			s.logger.Warn("webhook delivery failed; giving up", "event_id", d.eventID, "attempts", attempt, "error", err.Error())
			return
		}
		s.logger.Info("webhook delivery failed; retrying", "event_id", d.eventID, "attempt", attempt,
			"retry_in", backoff.String(), "error", err.Error())
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff *= 2
	}
}

// webhookSend makes one delivery attempt. The signature timestamp is the wall clock, not the
// simulator's clock, so that receivers enforcing stripe-go's 300 s tolerance (which compares
// with time.Now) accept it even after ClockAdvance.
func (s *Server) webhookSend(ctx context.Context, d webhookDelivery) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(d.payload))
	if err != nil {
		return 0, fmt.Errorf("error building webhook request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	req.Header.Set("Stripe-Signature", webhookSignatureHeader(d.payload, s.cfg.WebhookSecret, time.Now()))
	resp, err := s.cfg.WebhookHTTPClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("error posting webhook: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("webhook endpoint answered %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}

// sleepCtx sleeps for d and reports whether it did so without ctx ending first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
