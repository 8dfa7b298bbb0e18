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
	"net/netip"
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

func newWebhookDeliveryWorker(l *ledger.Ledger, logger *slog.Logger, timeout time.Duration, dialer *deliveryDialer) *WebhookDeliveryWorker {
	return &WebhookDeliveryWorker{ledger: l, logger: logger, now: time.Now, client: deliveryClient(timeout, dialer)}
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
			ledger.AlertWebhookEndpointDisabled.Attr(), slog.String("url", d.Endpoint.URL), slog.String("error", a.Error),
			slog.String("exit", fmt.Sprintf("fix the receiver, then billingctl webhooks enable %d and billingctl webhooks redeliver --endpoint %d --since <when it began failing>", d.Endpoint.ID, d.Endpoint.ID)))
	}
	switch rec.Status {
	case ledger.DeliveryDelivered:
		logger.InfoContext(ctx, "webhook delivered", slog.Int("http_status", a.StatusCode), slog.Duration("latency", a.Latency))
		return nil
	case ledger.DeliveryFailed:
		logger.ErrorContext(ctx, "ALERT webhook delivery failed: not delivered, no attempt left", ledger.AlertWebhookDeliveryFailed.Attr(),
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

// deliveryClient is the HTTP client of deliveries: bounded by timeout,
// following no redirects, using no proxy (from the environment or else:
// the address a delivery connects to is the receiver's own), and
// connecting through dialer, so only to the addresses its policy allows.
func deliveryClient(timeout time.Duration, dialer *deliveryDialer) *http.Client {
	transport := &http.Transport{
		Proxy:                 nil,
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

// deliveryDialer connects a delivery to its endpoint's host: it resolves
// the host itself, at each connection, and dials only the addresses policy
// allows (webhook.AddressPolicy: public ones, and the networks of
// TALLY_WEBHOOKS_ALLOW_CIDRS), each by its address. So a host that
// resolved to a public address when its endpoint was created and resolves
// to a private one now (DNS rebinding) is refused as it is dialled.
type deliveryDialer struct {
	policy   webhook.AddressPolicy
	resolver webhook.Resolver

	// dial connects to an address policy allowed: a net.Dialer whose
	// Control checks the policy again on the socket's address
	// (newDeliveryDialer), or a test's recorder.
	dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// newDeliveryDialer returns the dialer of deliveries under policy, resolving
// with net.DefaultResolver, each connection bounded by timeout.
func newDeliveryDialer(policy webhook.AddressPolicy, timeout time.Duration) *deliveryDialer {
	dialer := &net.Dialer{Timeout: timeout, Control: func(_, address string, _ syscall.RawConn) error {
		return deliveryAddressCheck(policy, address)
	}}
	return &deliveryDialer{policy: policy, resolver: net.DefaultResolver, dial: dialer.DialContext}
}

// DialContext connects to address (host:port) as http.Transport asks: to
// the first of the host's addresses that policy allows and that answers.
// The error of an address refused says which rule refused it, and is what
// the attempt log shows.
func (d *deliveryDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	addrs, err := webhook.LookupHost(ctx, d.resolver, host)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, addr := range addrs {
		addr = addr.Unmap() // a resolver may answer an IPv4 address as IPv4-mapped IPv6
		if err := d.policy.Check(addr); err != nil {
			to := ""
			if host != addr.String() {
				to = " to " + host
			}
			errs = append(errs, fmt.Errorf("refusing to deliver%s: %w", to, err))
			continue
		}
		conn, err := d.dial(ctx, network, net.JoinHostPort(addr.String(), port))
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("%s has no address", host)
	}
	return nil, errors.Join(errs...)
}

// deliveryAddressCheck says why policy refuses address (ip:port), the one
// a socket is about to connect to, or nil.
func deliveryAddressCheck(policy webhook.AddressPolicy, address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("refusing to deliver to %q: not an IP address", host)
	}
	if err := policy.Check(addr); err != nil {
		return fmt.Errorf("refusing to deliver: %w", err)
	}
	return nil
}
