package stripesim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"
)

// ControlClient calls a simulator's control API over HTTP, for tests that run the simulator in
// another process (cmd/stripesim). Its methods mirror the *Server methods of the same names.
// Errors answered 404, 409 and 400 wrap ErrNotFound, ErrConflict and ErrInvalid.
type ControlClient struct {
	// BaseURL is the simulator's base URL, e.g. "http://127.0.0.1:12111". Required.
	BaseURL string

	// HTTPClient makes the calls. Nil means http.DefaultClient.
	HTTPClient *http.Client
}

// do sends a control request with an optional JSON body and decodes a JSON answer into out
// (when out is non-nil).
func (c *ControlClient) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("error encoding stripesim %s %s request: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.BaseURL, "/")+path, body)
	if err != nil {
		return fmt.Errorf("error building stripesim %s %s request: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	httpClient := c.HTTPClient
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return fmt.Errorf("error calling stripesim %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("error reading stripesim %s %s answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var ce controlError
		msg := strings.TrimSpace(string(respBody))
		if json.Unmarshal(respBody, &ce) == nil && ce.Error != "" {
			msg = ce.Error
		}
		sentinel := error(nil)
		switch resp.StatusCode {
		case http.StatusNotFound:
			sentinel = ErrNotFound
		case http.StatusConflict:
			sentinel = ErrConflict
		case http.StatusBadRequest:
			sentinel = ErrInvalid
		}
		if sentinel != nil {
			return fmt.Errorf("stripesim %s %s answered %d: %w (%s)", method, path, resp.StatusCode, sentinel, msg)
		}
		return fmt.Errorf("stripesim %s %s answered %d: %s", method, path, resp.StatusCode, msg)
	}
	if out != nil {
		if err := json.Unmarshal(respBody, out); err != nil {
			return fmt.Errorf("error decoding stripesim %s %s answer: %w", method, path, err)
		}
	}
	return nil
}

// Health returns nil when the simulator answers GET /_sim/health.
func (c *ControlClient) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/_sim/health", nil, nil)
}

// FaultAdd adds a fault (POST /_sim/faults); see Server.FaultAdd.
func (c *ControlClient) FaultAdd(ctx context.Context, f Fault) error {
	return c.do(ctx, http.MethodPost, "/_sim/faults", f, nil)
}

// FaultClear removes every fault (DELETE /_sim/faults).
func (c *ControlClient) FaultClear(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/_sim/faults", nil, nil)
}

// FaultList returns the active faults (GET /_sim/faults); see Server.FaultList.
func (c *ControlClient) FaultList(ctx context.Context) ([]Fault, error) {
	var out listWire[Fault]
	if err := c.do(ctx, http.MethodGet, "/_sim/faults", nil, &out); err != nil {
		return nil, err
	}
	return out.Data, nil
}

// ClockNow returns the simulator's clock (GET /_sim/clock), to the second.
func (c *ControlClient) ClockNow(ctx context.Context) (time.Time, error) {
	var out clockWire
	if err := c.do(ctx, http.MethodGet, "/_sim/clock", nil, &out); err != nil {
		return time.Time{}, err
	}
	return out.Now, nil
}

// ClockAdvance moves the simulator's clock forward by d (POST /_sim/clock/advance) and returns
// the new time; see Server.ClockAdvance.
func (c *ControlClient) ClockAdvance(ctx context.Context, d time.Duration) (time.Time, error) {
	var out clockWire
	if err := c.do(ctx, http.MethodPost, "/_sim/clock/advance", map[string]float64{"seconds": d.Seconds()}, &out); err != nil {
		return time.Time{}, err
	}
	return out.Now, nil
}

// IdempotencyExpire forgets idempotency keys first used more than olderThan
// ago (POST /_sim/idempotency/expire); see Server.IdempotencyExpire.
func (c *ControlClient) IdempotencyExpire(ctx context.Context, olderThan time.Duration) (int, error) {
	var out struct {
		Expired int `json:"expired"`
	}
	err := c.do(ctx, http.MethodPost, "/_sim/idempotency/expire", map[string]float64{"older_than_seconds": olderThan.Seconds()}, &out)
	return out.Expired, err
}

// PaymentIntentList returns every PaymentIntent created, oldest first
// (GET /_sim/payment_intents); see Server.PaymentIntentList.
func (c *ControlClient) PaymentIntentList(ctx context.Context) ([]*stripe.PaymentIntent, error) {
	var out listWire[*stripe.PaymentIntent]
	if err := c.do(ctx, http.MethodGet, "/_sim/payment_intents", nil, &out); err != nil {
		return nil, err
	}
	if out.Data == nil {
		out.Data = []*stripe.PaymentIntent{}
	}
	return out.Data, nil
}

// PaymentIntentSettle settles an asynchronous PaymentIntent
// (POST /_sim/payment_intents/{id}/settle); see Server.PaymentIntentSettle.
func (c *ControlClient) PaymentIntentSettle(ctx context.Context, id string, params PaymentIntentSettleParams) (*stripe.PaymentIntent, error) {
	var out stripe.PaymentIntent
	if err := c.do(ctx, http.MethodPost, "/_sim/payment_intents/"+url.PathEscape(id)+"/settle", params, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CustomerSetDefaultPaymentMethod sets (or, with an empty paymentMethodID, removes) the
// customer's default payment method (PUT /_sim/customers/{id}); see
// Server.CustomerSetDefaultPaymentMethod.
func (c *ControlClient) CustomerSetDefaultPaymentMethod(ctx context.Context, customerID, paymentMethodID string) (*stripe.Customer, error) {
	var out stripe.Customer
	in := map[string]*string{"default_payment_method": stringOrNil(paymentMethodID)}
	if err := c.do(ctx, http.MethodPut, "/_sim/customers/"+url.PathEscape(customerID), in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RefundList returns every refund made, oldest first (GET /_sim/refunds); see
// Server.RefundList.
func (c *ControlClient) RefundList(ctx context.Context) ([]*stripe.Refund, error) {
	var out listWire[*stripe.Refund]
	if err := c.do(ctx, http.MethodGet, "/_sim/refunds", nil, &out); err != nil {
		return nil, err
	}
	if out.Data == nil {
		out.Data = []*stripe.Refund{}
	}
	return out.Data, nil
}

// ChargeRefund refunds amount of a charge, 0 meaning all that is left
// (POST /_sim/charges/{id}/refund); see Server.ChargeRefund.
func (c *ControlClient) ChargeRefund(ctx context.Context, chargeID string, amount int64) (*stripe.Charge, error) {
	var out stripe.Charge
	in := map[string]int64{"amount": amount}
	if err := c.do(ctx, http.MethodPost, "/_sim/charges/"+url.PathEscape(chargeID)+"/refund", in, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ChargeDispute opens a dispute on a charge (POST /_sim/charges/{id}/dispute); see
// Server.ChargeDispute.
func (c *ControlClient) ChargeDispute(ctx context.Context, chargeID string) (*stripe.Dispute, error) {
	var out stripe.Dispute
	if err := c.do(ctx, http.MethodPost, "/_sim/charges/"+url.PathEscape(chargeID)+"/dispute", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// EventList returns every event generated, oldest first (GET /_sim/events); see
// Server.EventList.
func (c *ControlClient) EventList(ctx context.Context) ([]Event, error) {
	var out listWire[Event]
	if err := c.do(ctx, http.MethodGet, "/_sim/events", nil, &out); err != nil {
		return nil, err
	}
	if out.Data == nil {
		out.Data = []Event{}
	}
	return out.Data, nil
}

// EventResend queues one more delivery of an event (POST /_sim/events/{id}/resend); see
// Server.EventResend.
func (c *ControlClient) EventResend(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/_sim/events/"+url.PathEscape(id)+"/resend", nil, nil)
}

// WebhookModeGet returns the webhook delivery mode (GET /_sim/webhooks).
func (c *ControlClient) WebhookModeGet(ctx context.Context) (WebhookMode, error) {
	var out WebhookMode
	err := c.do(ctx, http.MethodGet, "/_sim/webhooks", nil, &out)
	return out, err
}

// WebhookModeSet replaces the webhook delivery mode (POST /_sim/webhooks) and returns the mode
// in effect; see Server.WebhookModeSet.
func (c *ControlClient) WebhookModeSet(ctx context.Context, mode WebhookMode) (WebhookMode, error) {
	var out WebhookMode
	err := c.do(ctx, http.MethodPost, "/_sim/webhooks", mode, &out)
	return out, err
}

// Stats returns the simulator's counters (GET /_sim/stats); see Server.Stats.
func (c *ControlClient) Stats(ctx context.Context) (Stats, error) {
	var out Stats
	err := c.do(ctx, http.MethodGet, "/_sim/stats", nil, &out)
	return out, err
}

// Reset forgets all simulator state (POST /_sim/reset); see Server.Reset.
func (c *ControlClient) Reset(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/_sim/reset", nil, nil)
}
