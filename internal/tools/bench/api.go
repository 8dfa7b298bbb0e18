package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// apiClient talks to one Tally server over keep-alive HTTP on loopback.
type apiClient struct {
	base string // http://127.0.0.1:port
	key  string
	http *http.Client
}

// newAPIClient returns a client whose transport keeps at least conns idle
// connections to the server, so every closed-loop client reuses its own.
func newAPIClient(base, key string, conns int) *apiClient {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        2 * conns,
		MaxIdleConnsPerHost: 2 * conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &apiClient{base: base, key: key, http: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// close drops the client's idle connections.
func (c *apiClient) close() { c.http.CloseIdleConnections() }

// statusError is a non-2xx answer, with the start of its body as a sample.
type statusError struct {
	method, path string
	status       int
	body         string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.method, e.path, e.status, e.body)
}

// do sends body (JSON) and returns nil on a 2xx answer, a *statusError on
// any other, or the transport's error. The answer is read in full so the
// connection is reused.
func (c *apiClient) do(ctx context.Context, method, path string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("error building %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		_, err := io.Copy(io.Discard, resp.Body)
		return err
	}
	sample, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	_, _ = io.Copy(io.Discard, resp.Body)
	return &statusError{method: method, path: path, status: resp.StatusCode, body: string(sample)}
}

// customerPut creates or updates customer id (currency usd) with PUT
// /v1/customers/{id}, with its usage_alert_thresholds_cents, a JSON array
// ("": none).
func (c *apiClient) customerPut(ctx context.Context, id, thresholds string) error {
	body := `{"stripe_customer_id":"cus_` + id + `","currency":"usd"`
	if thresholds != "" {
		body += `,"usage_alert_thresholds_cents":` + thresholds
	}
	return c.do(ctx, http.MethodPut, "/v1/customers/"+id, []byte(body+"}"))
}

// event is one usage event to post. Ids are plain ASCII (letters, digits
// and dashes), so they go into JSON unescaped.
type event struct {
	customer   string
	id         string
	amount     int64
	occurredAt string // RFC 3339; empty: omitted (now)
}

// appendEvent appends ev as a JSON object to b.
func appendEvent(b []byte, ev event) []byte {
	b = append(b, `{"customer_id":"`...)
	b = append(b, ev.customer...)
	b = append(b, `","event_id":"`...)
	b = append(b, ev.id...)
	b = append(b, `","amount_cents":`...)
	b = strconv.AppendInt(b, ev.amount, 10)
	if ev.occurredAt != "" {
		b = append(b, `,"occurred_at":"`...)
		b = append(b, ev.occurredAt...)
		b = append(b, '"')
	}
	return append(b, '}')
}

// appendBatch appends {"events":[…]} to b.
func appendBatch(b []byte, events []event) []byte {
	b = append(b, `{"events":[`...)
	for i, ev := range events {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendEvent(b, ev)
	}
	return append(b, "]}"...)
}

// Paths of the usage-event endpoints (internal/api/routes.go).
const (
	pathEvent = "/v1/usage-events"
	pathBatch = "/v1/usage-events/batch"
)
