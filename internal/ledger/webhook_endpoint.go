package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tally-billing/tally/internal/webhook"
)

// WebhookEndpoint is where Tally posts the notifications of the types it
// subscribes to (notification.go), signed with its secret
// (internal/webhook).
type WebhookEndpoint struct {
	ID          int64
	URL         string
	Events      []string
	Description string
	CreatedAt   time.Time
	UpdatedAt   time.Time

	// DisabledAt is set while the endpoint is disabled for failing: nothing
	// is sent to it until WebhookEndpointEnable.
	DisabledAt     *time.Time
	DisabledReason *string

	// Secrets sign a delivery: the current secret, and the previous one
	// until PreviousSecretUntil after a rotation. Only the endpoint's
	// creation and a rotation show a secret to the API.
	Secret              string
	PreviousSecret      *string
	PreviousSecretUntil *time.Time
}

// SigningSecrets are the secrets that sign a delivery at now.
func (e *WebhookEndpoint) SigningSecrets(now time.Time) []string {
	s := []string{e.Secret}
	if e.PreviousSecret != nil && e.PreviousSecretUntil != nil && now.Before(*e.PreviousSecretUntil) {
		s = append(s, *e.PreviousSecret)
	}
	return s
}

// WebhookEndpointCreateParams are the fields of WebhookEndpointCreate.
type WebhookEndpointCreateParams struct {
	URL         string
	Events      []string // NotificationTypes, or NotifyAll
	Description string
}

// webhookDescriptionMax bounds an endpoint's description.
const webhookDescriptionMax = 500

// WebhookEndpointsMax is how many endpoints (not deleted; a disabled one
// counts) a deployment may have. Every notification is written once per
// endpoint in the transaction of the change it reports, a charge's
// included, so the number is kept small. A trigger holds it under
// concurrent creations (migration 00021).
const WebhookEndpointsMax = 16

// webhookEndpointsMaxConstraint names the trigger's refusal of one more.
const webhookEndpointsMaxConstraint = "webhook_endpoints_max"

// webhookLookupTimeout bounds the resolution of an endpoint's host at its
// creation.
const webhookLookupTimeout = 5 * time.Second

// webhookEndpointValidate checks p: its URL (webhookURLProblem, then where
// its host points, webhookHostProblem), its events and its description.
func (l *Ledger) webhookEndpointValidate(ctx context.Context, p *WebhookEndpointCreateParams) error {
	fe := fieldErrors{}
	policy := webhook.AddressPolicy{Allow: l.config.WebhooksAllow}
	if why := webhookURLProblem(p.URL, policy); why != "" {
		fe.add("url", "%s", why)
	}
	if why := webhookEventsProblem(p.Events); why != "" {
		fe.add("events", "%s", why)
	}
	switch {
	case len(p.Description) > webhookDescriptionMax:
		fe.add("description", "must be at most %d bytes", webhookDescriptionMax)
	case !utf8.ValidString(p.Description) || strings.ContainsRune(p.Description, 0):
		fe.add("description", "must be valid UTF-8 text without NUL characters")
	}
	if len(fe) == 0 {
		parsed, _ := url.Parse(p.URL) // webhookURLProblem parsed it
		if why := l.webhookHostProblem(ctx, policy, parsed.Hostname()); why != "" {
			fe.add("url", "%s", why)
		}
	}
	return fe.err()
}

// webhookEventsProblem says what is wrong with events as an endpoint's
// list of notification types, or "": at least one, each a type listed
// once, or NotifyAll alone.
func webhookEventsProblem(events []string) string {
	if len(events) == 0 {
		return `is required: a list of notification types, or ["*"] for all`
	}
	if len(events) > len(NotificationTypes) {
		return fmt.Sprintf(`lists %d types; there are %d, each listed at most once (or ["*"] for all)`, len(events), len(NotificationTypes))
	}
	for i, e := range events {
		switch {
		case e == NotifyAll && len(events) > 1:
			return `"*" subscribes to every type: send ["*"] alone`
		case e != NotifyAll && !slices.Contains(NotificationTypes, e):
			return fmt.Sprintf("%q is not a notification type; one of %s, or \"*\"", e, strings.Join(NotificationTypes, ", "))
		case slices.Contains(events[:i], e):
			return fmt.Sprintf("%q is listed twice; list each type once", e)
		}
	}
	return ""
}

// webhookURLProblem says what is wrong with u as a webhook endpoint's URL,
// or "": https with a host, no credentials; plain http only to a loopback
// host that policy allows (TALLY_WEBHOOKS_ALLOW_CIDRS=127.0.0.0/8,::1/128,
// for development). Where the host points is checked next
// (webhookHostProblem), and at each delivery (internal/jobs).
func webhookURLProblem(u string, policy webhook.AddressPolicy) string {
	parsed, err := url.Parse(u)
	switch {
	case u == "":
		return "is required"
	case len(u) > 2048:
		return "must be at most 2048 bytes"
	case !utf8.ValidString(u) || hasControl(u):
		return "must be valid UTF-8 without control characters"
	case err != nil || !parsed.IsAbs() || parsed.Hostname() == "":
		return "must be an absolute https URL, like https://example.com/tally/webhooks"
	case parsed.User != nil:
		return "must not carry credentials"
	case parsed.Fragment != "":
		return "must not have a fragment"
	case parsed.Scheme == "https":
		return ""
	case parsed.Scheme == "http" && policy.AllowsLoopback(parsed.Hostname()):
		return ""
	}
	return "must use https (plain http only to a loopback host, such as localhost or 127.0.0.1, that " +
		webhook.AllowVariable + " allows, for development)"
}

// webhookHostProblem says why policy refuses host, where an endpoint's URL
// points, or "": an address policy refuses, or a name that resolves to one
// now. A name that does not resolve now is accepted: each delivery resolves
// it again and checks the address it dials, which is the guard; this is the
// early, friendly refusal.
func (l *Ledger) webhookHostProblem(ctx context.Context, policy webhook.AddressPolicy, host string) string {
	ctx, cancel := context.WithTimeout(ctx, webhookLookupTimeout)
	defer cancel()
	addrs, err := webhook.LookupHost(ctx, l.config.WebhooksResolver, host)
	if err != nil {
		l.logger.InfoContext(ctx, "webhook endpoint's host does not resolve; accepted, each delivery checks the address it dials",
			slog.String("host", host), slog.String("error", err.Error()))
		return ""
	}
	for _, addr := range addrs {
		if err := policy.Check(addr); err != nil {
			if host != addr.String() {
				return fmt.Sprintf("host %s resolves to %s, and %v", host, addr, err)
			}
			return err.Error()
		}
	}
	return ""
}

// webhookEndpointColumns are an endpoint's columns, of the table aliased e.
const webhookEndpointColumns = `e.id, e.url, e.events, e.description, e.secret, e.previous_secret,
       e.previous_secret_until, e.disabled_at, e.disabled_reason, e.created_at, e.updated_at`

// scanWebhookEndpoint scans webhookEndpointColumns, then extra.
func scanWebhookEndpoint(row pgx.Row, extra ...any) (*WebhookEndpoint, error) {
	var e WebhookEndpoint
	dest := append([]any{&e.ID, &e.URL, &e.Events, &e.Description, &e.Secret, &e.PreviousSecret,
		&e.PreviousSecretUntil, &e.DisabledAt, &e.DisabledReason, &e.CreatedAt, &e.UpdatedAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	return &e, nil
}

// WebhookEndpointCreate registers an endpoint and returns it with its
// signing secret, which only this answer and a rotation show. It returns a
// *ValidationError naming the field (url, events, description), or
// webhook_endpoints when the deployment has WebhookEndpointsMax already.
func (l *Ledger) WebhookEndpointCreate(ctx context.Context, p WebhookEndpointCreateParams) (*WebhookEndpoint, error) {
	if err := l.webhookEndpointValidate(ctx, &p); err != nil {
		return nil, err
	}
	secret, err := webhook.NewSecret()
	if err != nil {
		return nil, err
	}
	e, err := scanWebhookEndpoint(l.pool.QueryRow(ctx, `
INSERT INTO billing.webhook_endpoints AS e (url, events, description, secret, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $5)
RETURNING `+webhookEndpointColumns, p.URL, p.Events, p.Description, secret, l.now()))
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.ConstraintName == webhookEndpointsMaxConstraint {
		return nil, &ValidationError{Fields: map[string]string{"webhook_endpoints": fmt.Sprintf(
			"this deployment has %d webhook endpoints, the most it may have (each notification is written once per endpoint); "+
				"delete one it no longer needs first", WebhookEndpointsMax)}}
	}
	if err != nil {
		return nil, fmt.Errorf("error creating webhook endpoint: %w", err)
	}
	return e, nil
}

// WebhookEndpointList returns the endpoints not deleted, oldest first.
func (l *Ledger) WebhookEndpointList(ctx context.Context) ([]*WebhookEndpoint, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+webhookEndpointColumns+`
FROM billing.webhook_endpoints e WHERE deleted_at IS NULL ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("error listing webhook endpoints: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*WebhookEndpoint, error) { return scanWebhookEndpoint(row) })
	if err != nil {
		return nil, fmt.Errorf("error listing webhook endpoints: %w", err)
	}
	return list, nil
}

// WebhookEndpointDelete deletes endpoint id: nothing more is sent to it, and
// its deliveries not yet made are canceled. Its log stays. It returns
// ErrNotFound when there is no such endpoint (or it was deleted).
func (l *Ledger) WebhookEndpointDelete(ctx context.Context, id int64) error {
	return l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		tag, err := tx.Exec(ctx, `
UPDATE billing.webhook_endpoints SET deleted_at = $2, updated_at = $2 WHERE id = $1 AND deleted_at IS NULL`, id, now)
		if err != nil {
			return fmt.Errorf("error deleting webhook endpoint %d: %w", id, err)
		}
		if tag.RowsAffected() == 0 {
			return notFound("webhook endpoint %d", id)
		}
		if _, err := tx.Exec(ctx, `
UPDATE billing.webhook_deliveries SET status = 'canceled', updated_at = $2
WHERE endpoint_id = $1 AND status = 'pending'`, id, now); err != nil {
			return fmt.Errorf("error canceling deliveries to webhook endpoint %d: %w", id, err)
		}
		return nil
	})
}

// WebhookSecretGraceDefault is how long the previous secret of a rotated
// endpoint keeps signing, so the producer can deploy the new one.
const WebhookSecretGraceDefault = 24 * time.Hour

// WebhookSecretGraceMax bounds that grace.
const WebhookSecretGraceMax = 7 * 24 * time.Hour

// WebhookEndpointRotateSecret gives endpoint id a new secret and returns the
// endpoint with it; the old one keeps signing for grace, at most
// WebhookSecretGraceMax (both sign each delivery meanwhile). It returns
// ErrNotFound when there is no such endpoint.
func (l *Ledger) WebhookEndpointRotateSecret(ctx context.Context, id int64, grace time.Duration) (*WebhookEndpoint, error) {
	if grace < 0 || grace > WebhookSecretGraceMax {
		return nil, &ValidationError{Fields: map[string]string{"grace_period_seconds": fmt.Sprintf(
			"must be between 0 and %d seconds (a week)", int64(WebhookSecretGraceMax/time.Second))}}
	}
	secret, err := webhook.NewSecret()
	if err != nil {
		return nil, err
	}
	now := l.now()
	e, err := scanWebhookEndpoint(l.pool.QueryRow(ctx, `
UPDATE billing.webhook_endpoints e
SET previous_secret = secret, previous_secret_until = $3, secret = $2, updated_at = $4
WHERE id = $1 AND deleted_at IS NULL
RETURNING `+webhookEndpointColumns, id, secret, now.Add(grace), now))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("webhook endpoint %d", id)
	}
	if err != nil {
		return nil, fmt.Errorf("error rotating the secret of webhook endpoint %d: %w", id, err)
	}
	return e, nil
}

// WebhookEndpointEnable enables endpoint id again after it was disabled for
// failing; the notifications written meanwhile were not sent to it
// (WebhookRedeliver sends them). It returns the endpoint, or ErrNotFound.
func (l *Ledger) WebhookEndpointEnable(ctx context.Context, id int64) (*WebhookEndpoint, error) {
	e, err := scanWebhookEndpoint(l.pool.QueryRow(ctx, `
UPDATE billing.webhook_endpoints e SET disabled_at = NULL, disabled_reason = NULL, updated_at = $2
WHERE id = $1 AND deleted_at IS NULL
RETURNING `+webhookEndpointColumns, id, l.now()))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("webhook endpoint %d", id)
	}
	if err != nil {
		return nil, fmt.Errorf("error enabling webhook endpoint %d: %w", id, err)
	}
	return e, nil
}
