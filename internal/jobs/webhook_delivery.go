package jobs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/riverqueue/river"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/webhook"
)

// QueueDeliveries is the queue of webhook_delivery jobs: its own, with its
// own worker limit, so delivering never slows ingest or charging.
const QueueDeliveries = "webhook_deliveries"

// Delivery defaults.
const (
	// DeliveryWorkersDefault is how many deliveries a replica makes at once.
	DeliveryWorkersDefault = 10

	// DeliveryTimeoutDefault bounds one attempt, answer included.
	DeliveryTimeoutDefault = 10 * time.Second

	// deliveryMaxAttempts with River's backoff capped at an hour
	// (RetryMaxDelayDefault) spans about three days.
	deliveryMaxAttempts = 72

	// deliveryExcerptMax bounds the answer's body kept in the attempt log.
	deliveryExcerptMax = 1024
)

// WebhookDeliveryArgs are the args of the job that posts one notification to
// one endpoint (a billing.webhook_deliveries row).
type WebhookDeliveryArgs struct {
	DeliveryID int64 `json:"delivery_id"`
}

// Kind is the River job kind, "webhook_delivery".
func (WebhookDeliveryArgs) Kind() string { return "webhook_delivery" }

// InsertOpts puts the job on QueueDeliveries.
func (WebhookDeliveryArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueDeliveries, MaxAttempts: deliveryMaxAttempts}
}

// WebhookDeliveryWorker posts a notification to an endpoint, signed with the
// endpoint's secrets (internal/webhook), logs the attempt, and lets River
// retry with backoff until the endpoint answers 2xx or the attempts run out.
type WebhookDeliveryWorker struct {
	river.WorkerDefaults[WebhookDeliveryArgs]

	ledger *ledger.Ledger
	client *http.Client
	logger *slog.Logger
	now    func() time.Time
}

func newWebhookDeliveryWorker(l *ledger.Ledger, logger *slog.Logger, timeout time.Duration, allowLoopback bool) *WebhookDeliveryWorker {
	return &WebhookDeliveryWorker{ledger: l, logger: logger, now: time.Now, client: deliveryClient(timeout, allowLoopback)}
}

// Work makes one attempt of the delivery.
func (w *WebhookDeliveryWorker) Work(ctx context.Context, job *river.Job[WebhookDeliveryArgs]) error {
	d, err := w.ledger.WebhookDeliveryGet(ctx, job.Args.DeliveryID)
	if err != nil {
		return err
	}
	if d.Status != ledger.DeliveryPending {
		return nil
	}
	logger := w.logger.With(slog.Int64("delivery_id", d.ID), slog.String("notification_id", d.NotificationID),
		slog.String("type", d.Type), slog.Int64("endpoint_id", d.Endpoint.ID), slog.Int("job_attempt", job.Attempt))
	if d.EndpointGone {
		// Written as the endpoint was deleted, after its deliveries were
		// canceled: cancel this one too.
		return w.ledger.WebhookDeliveryCancel(ctx, d.ID)
	}
	a := ledger.WebhookAttempt{DeliveryID: d.ID, StartedAt: w.now(), Last: true, Error: "not sent: the endpoint is disabled"}
	if d.Endpoint.DisabledAt == nil {
		a = w.post(ctx, d)
		a.Last = job.Attempt >= job.MaxAttempts
	}
	rec, err := w.ledger.WebhookAttemptRecord(context.WithoutCancel(ctx), a)
	if err != nil {
		return err
	}
	if rec.Disabled {
		logger.ErrorContext(ctx, "ALERT webhook endpoint disabled: a delivery failed every attempt, for days, and nothing was delivered since",
			slog.String("alert", "webhook_endpoint_disabled"), slog.String("url", d.Endpoint.URL), slog.String("error", a.Error),
			slog.String("exit", fmt.Sprintf("fix the receiver, then billingctl webhooks enable %d and billingctl webhooks redeliver --endpoint %d --since <when it began failing>", d.Endpoint.ID, d.Endpoint.ID)))
	}
	switch rec.Status {
	case ledger.DeliveryDelivered:
		logger.InfoContext(ctx, "webhook delivered", slog.Int("http_status", a.StatusCode), slog.Duration("latency", a.Latency))
		return nil
	case ledger.DeliveryFailed:
		logger.ErrorContext(ctx, "ALERT webhook delivery failed: not delivered, no attempt left", slog.String("alert", "webhook_delivery_failed"),
			slog.String("url", d.Endpoint.URL), slog.Int("http_status", a.StatusCode), slog.String("error", a.Error),
			slog.String("exit", fmt.Sprintf("billingctl webhooks redeliver --notification %s", d.NotificationID)))
		return nil
	case ledger.DeliveryPending:
		logger.WarnContext(ctx, "webhook delivery failed; retrying", slog.String("url", d.Endpoint.URL),
			slog.Int("http_status", a.StatusCode), slog.String("error", a.Error))
		return fmt.Errorf("delivery %d to endpoint %d: %s", d.ID, d.Endpoint.ID, a.Error)
	}
	return nil // canceled meanwhile
}

// post makes one attempt and describes it.
func (w *WebhookDeliveryWorker) post(ctx context.Context, d *ledger.WebhookDelivery) ledger.WebhookAttempt {
	start := w.now()
	a := ledger.WebhookAttempt{DeliveryID: d.ID, StartedAt: start}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.Endpoint.URL, bytes.NewReader(d.Body))
	if err != nil {
		a.Error = "error building the request: " + err.Error()
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Tally-Webhooks/1")
	req.Header.Set("Tally-Notification-Id", d.NotificationID)
	req.Header.Set(webhook.SignatureHeader, webhook.Sign(d.Body, start, d.Secrets...))
	resp, err := w.client.Do(req)
	a.Latency = w.now().Sub(start)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	defer resp.Body.Close()
	excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, deliveryExcerptMax))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	a.StatusCode = resp.StatusCode
	a.Excerpt = textExcerpt(excerpt)
	if !a.Delivered() {
		a.Error = "answered " + resp.Status
	}
	return a
}

// textExcerpt is b as text Postgres stores: valid UTF-8 (a character cut
// off at the end dropped), without NUL characters.
func textExcerpt(b []byte) string {
	return strings.ReplaceAll(strings.ToValidUTF8(string(b), ""), "\x00", "")
}

// errForbiddenAddress is a delivery refused by the address it would reach.
var errForbiddenAddress = errors.New("refusing to deliver to a link-local, metadata, unspecified or multicast address")

// deliveryClient is the HTTP client of deliveries: bounded by timeout,
// following no redirects, and never connecting to a link-local address
// (169.254.0.0/16 holds cloud metadata services), an unspecified or
// multicast one, or a loopback one unless allowLoopback (development). The
// check is on the address actually dialled, so DNS cannot steer round it.
func deliveryClient(timeout time.Duration, allowLoopback bool) *http.Client {
	dialer := &net.Dialer{Timeout: timeout, Control: func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		ip := net.ParseIP(host)
		if ip == nil || deliveryAddressForbidden(ip, allowLoopback) {
			return fmt.Errorf("%w: %s", errForbiddenAddress, host)
		}
		return nil
	}}
	transport := &http.Transport{
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
	}
	return &http.Client{
		Timeout:   timeout,
		Transport: transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a 3xx is a failed attempt
		},
	}
}

// deliveryAddressForbidden says whether a delivery may not connect to ip.
func deliveryAddressForbidden(ip net.IP, allowLoopback bool) bool {
	metadataV6 := net.ParseIP("fd00:ec2::254")
	switch {
	case ip.IsLoopback():
		return !allowLoopback
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast(), ip.IsInterfaceLocalMulticast(),
		ip.IsMulticast(), ip.IsUnspecified(), ip.Equal(metadataV6):
		return true
	}
	return false
}
