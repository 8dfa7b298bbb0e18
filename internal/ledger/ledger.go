package ledger

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tally-billing/tally/internal/webhook"
)

// CloseGraceDefault is how long after a period's end late events are still
// accepted, when Config.CloseGrace is zero.
const CloseGraceDefault = time.Hour

// StripeKeyWindowDefault is how long a charge's idempotency key is trusted
// after its first use, when Config.StripeKeyWindow is zero. Stripe keeps a
// key for at least 24 h; the hour of margin covers clock skew and slow calls.
const StripeKeyWindowDefault = 23 * time.Hour

// NamespaceDefault is the deployment namespace when Config.Namespace is
// empty.
const NamespaceDefault = "default"

// namespacePattern is what a namespace may be (the column's CHECK too).
var namespacePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// NamespaceValid reports whether s may be a deployment namespace.
func NamespaceValid(s string) bool { return namespacePattern.MatchString(s) }

// Namespace returns the deployment namespace of new charges.
func (l *Ledger) Namespace() string { return l.config.Namespace }

// AnomalyFactorDefault is the anomaly guard's factor that the server
// configures when TALLY_ANOMALY_FACTOR is unset.
const AnomalyFactorDefault = 10.0

// Scheduler inserts and reschedules River jobs in the caller's transaction,
// so a job commits or rolls back with the ledger rows that asked for it: the
// transactional outbox. internal/jobs implements it with River.
type Scheduler interface {
	// ChargeJobInsertTx inserts the charge job of (customerID, period),
	// scheduled at runAt and unique per pair, and returns its id.
	ChargeJobInsertTx(ctx context.Context, tx pgx.Tx, customerID, period string, runAt time.Time) (jobID int64, err error)

	// ChargeJobRunNowTx makes the charge job of (customerID, period), whose
	// id was jobID, available to run at once (a running job is left alone),
	// and returns its id: a new job's when River had already deleted the old
	// one (completed jobs are deleted after a day, discarded ones after a
	// week).
	ChargeJobRunNowTx(ctx context.Context, tx pgx.Tx, jobID int64, customerID, period string) (int64, error)

	// StripeEventJobInsertTx inserts the job that processes the stored Stripe
	// event eventID, and returns its id.
	StripeEventJobInsertTx(ctx context.Context, tx pgx.Tx, eventID string) (jobID int64, err error)

	// ChargeResolveJobInsertTx inserts the job that carries out an
	// operator's resolve of a double charge (ChargeResolveRequest): keep one
	// PaymentIntent, refund the others, settle the charge.
	ChargeResolveJobInsertTx(ctx context.Context, tx pgx.Tx, p ChargeResolveJob) (jobID int64, err error)

	// TopUpJobInsertTx inserts the job of top-up topUpID of customerID,
	// unique per top-up, and returns its id.
	TopUpJobInsertTx(ctx context.Context, tx pgx.Tx, customerID, topUpID string) (jobID int64, err error)

	// TopUpJobRunNowTx makes the job of a top-up, whose id was jobID,
	// available to run at once (as ChargeJobRunNowTx), and returns its id.
	TopUpJobRunNowTx(ctx context.Context, tx pgx.Tx, jobID int64, customerID, topUpID string) (int64, error)

	// WebhookDeliveryJobInsertTx inserts the job that delivers webhook
	// delivery deliveryID, and returns its id.
	WebhookDeliveryJobInsertTx(ctx context.Context, tx pgx.Tx, deliveryID int64) (jobID int64, err error)

	// ChargingPausedTx returns since when the charge queue is paused (the
	// kill switch), or nil when it is not.
	ChargingPausedTx(ctx context.Context, tx pgx.Tx) (*time.Time, error)

	// ChargingPauseTx pauses the charge queue on every replica; a paused
	// queue stays paused across restarts.
	ChargingPauseTx(ctx context.Context, tx pgx.Tx) error

	// ChargingResumeTx resumes the charge queue.
	ChargingResumeTx(ctx context.Context, tx pgx.Tx) error
}

// Config configures a Ledger. Its zero value works except for Scheduler,
// which ingest, closing and webhooks require.
type Config struct {
	// Cadence is the length of billing periods. Default CadenceMonth.
	Cadence Cadence

	// CloseGrace is how long after its end a period still accepts late
	// events; it closes at end + CloseGrace. Default CloseGraceDefault.
	CloseGrace time.Duration

	// StripeKeyWindow is how long after the first attempt of a key
	// generation the key may be reused without reconciling first. Default
	// StripeKeyWindowDefault.
	StripeKeyWindow time.Duration

	// PeriodBudgetCents caps, per period label and currency, the amounts of
	// charges in flight plus those that succeeded; a charge that would exceed
	// it is held over_period_budget. Zero: no budget.
	PeriodBudgetCents int64

	// AnomalyFactor holds a charge above this factor times the median of the
	// customer's last six succeeded charges (with at least three). Zero
	// disables the guard; the server's default is AnomalyFactorDefault.
	AnomalyFactor float64

	// Namespace is the deployment namespace (TALLY_NAMESPACE) that new
	// charges derive their keys from and send as metadata.tally_namespace:
	// deployments sharing one Stripe account never touch each other's
	// PaymentIntents. Lower-case letters, digits, _ and -, up to 63. Default
	// NamespaceDefault.
	Namespace string

	// APIKeyCacheTTL is how long an authenticated API key is trusted, and
	// an unknown or revoked secret refused, without reading Postgres again.
	// Default APIKeyCacheTTLDefault.
	APIKeyCacheTTL time.Duration

	// WebhooksAllow are the non-public networks webhook endpoints may point
	// to (TALLY_WEBHOOKS_ALLOW_CIDRS); an endpoint naming any other
	// non-public address is refused (webhook.AddressPolicy). Plain http is
	// accepted only to a loopback host allowed here (development). Empty:
	// public addresses only, https only.
	WebhooksAllow []netip.Prefix

	// WebhooksResolver resolves the host of an endpoint being created, to
	// refuse one that points to an address WebhooksAllow does not allow.
	// Default net.DefaultResolver.
	WebhooksResolver webhook.Resolver

	// DunningSchedule is when a charge declined for a reason a later try can
	// fix is retried: offsets from its first decline (ParseDunningSchedule).
	// Empty: such a decline is final (failed). The server's default is
	// DunningScheduleDefault.
	DunningSchedule []time.Duration

	// IngestGroupMax is how many single events (UsageEventRecord) one
	// shared statement and commit may hold; 1 writes each event on its own,
	// as before group commit. Default IngestGroupMaxDefault.
	IngestGroupMax int

	// IngestWriters is how many groups of single events are written at
	// once; an event that finds them all busy waits for the next group.
	// Default IngestWritersDefault.
	IngestWriters int

	// OnIngestGroup, when set, is told the size of every group of single
	// events written (1: an event written alone): the server observes them
	// in tally_ingest_group_events.
	OnIngestGroup func(events int)

	// OnChargeTransition, when set, is told of every charge status change
	// (from is "" for a charge's creation) once its transaction committed:
	// the server counts them in tally_charge_transitions_total.
	OnChargeTransition func(from, to string)

	// Clock returns the current time. Default time.Now.
	Clock func() time.Time

	// Scheduler inserts jobs in ledger transactions.
	Scheduler Scheduler

	// Logger receives the ledger's logs. Default: discarded.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Cadence == "" {
		c.Cadence = CadenceDefault
	}
	if c.CloseGrace == 0 {
		c.CloseGrace = CloseGraceDefault
	}
	if c.StripeKeyWindow == 0 {
		c.StripeKeyWindow = StripeKeyWindowDefault
	}
	if c.APIKeyCacheTTL == 0 {
		c.APIKeyCacheTTL = APIKeyCacheTTLDefault
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Namespace == "" {
		c.Namespace = NamespaceDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.WebhooksResolver == nil {
		c.WebhooksResolver = net.DefaultResolver
	}
	if c.IngestGroupMax == 0 {
		c.IngestGroupMax = IngestGroupMaxDefault
	}
	if c.IngestWriters == 0 {
		c.IngestWriters = IngestWritersDefault
	}
	return c
}

func (c Config) validate() error {
	if _, err := ParseCadence(string(c.Cadence)); err != nil {
		return fmt.Errorf("Cadence: %w", err)
	}
	if c.CloseGrace < 0 {
		return errors.New("CloseGrace must not be negative")
	}
	if c.IngestGroupMax < 1 || c.IngestGroupMax > UsageEventBatchMax {
		return fmt.Errorf("IngestGroupMax %d: must be between 1 and %d", c.IngestGroupMax, UsageEventBatchMax)
	}
	if c.IngestWriters < 1 {
		return fmt.Errorf("IngestWriters %d: must be at least 1", c.IngestWriters)
	}
	if c.APIKeyCacheTTL < 0 {
		return errors.New("APIKeyCacheTTL must not be negative")
	}
	if c.StripeKeyWindow < 0 {
		return errors.New("StripeKeyWindow must not be negative")
	}
	if c.PeriodBudgetCents < 0 {
		return errors.New("PeriodBudgetCents must not be negative")
	}
	if c.AnomalyFactor < 0 {
		return errors.New("AnomalyFactor must not be negative")
	}
	if !NamespaceValid(c.Namespace) {
		return fmt.Errorf("Namespace %q: use lower-case letters, digits, _ and -, 1 to 63 of them, starting with a letter or digit", c.Namespace)
	}
	return nil
}

// Ledger runs Tally's domain operations against Postgres.
type Ledger struct {
	pool    *pgxpool.Pool
	config  Config
	logger  *slog.Logger
	apiKeys apiKeyCache
	groups  eventGroups // single events sharing commits (usage_event_group.go)
}

// New returns a Ledger using pool, or an error naming the invalid Config field.
func New(pool *pgxpool.Pool, config Config) (*Ledger, error) {
	config = config.WithDefaults()
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("invalid ledger config: %w", err)
	}
	return &Ledger{pool: pool, config: config, logger: config.Logger,
		groups: eventGroups{writers: config.IngestWriters, max: config.IngestGroupMax}}, nil
}

// Cadence returns the configured billing period length.
func (l *Ledger) Cadence() Cadence { return l.config.Cadence }

// now is the one timestamp a transaction uses, rounded to Postgres's
// microsecond precision so what is returned equals what is stored.
func (l *Ledger) now() time.Time {
	return l.config.Clock().UTC().Truncate(time.Microsecond)
}

// idMaxBytes is the longest id (customer, event, Stripe) the ledger stores.
const idMaxBytes = 255

// checkID adds a message to fe when id is empty, too long, not UTF-8 or
// contains control characters.
func checkID(fe fieldErrors, field, id string, required bool) {
	switch {
	case id == "" && required:
		fe.add(field, "is required")
	case len(id) > idMaxBytes:
		fe.add(field, "is %d bytes long; send at most %d bytes", len(id), idMaxBytes)
	case !utf8.ValidString(id):
		fe.add(field, "must be valid UTF-8")
	case hasControl(id):
		fe.add(field, "must not contain control characters")
	}
}

// ValidID reports whether id could have been stored as an id (customer,
// event, Stripe's): 1 to 255 bytes of UTF-8 without control characters. A
// lookup of anything else finds nothing, without sending Postgres bytes it
// refuses.
func ValidID(id string) bool {
	return id != "" && len(id) <= idMaxBytes && utf8.ValidString(id) && !hasControl(id)
}

func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

// checkCurrency adds a message to fe unless c is three lower-case letters.
func checkCurrency(fe fieldErrors, field, c string) {
	if len(c) != 3 || !isLowerAlpha(c) {
		fe.add(field, "must be a three-letter ISO 4217 code in lower case, such as \"usd\"; got %q", c)
	}
}

func isLowerAlpha(s string) bool {
	for _, r := range s {
		if r < 'a' || r > 'z' {
			return false
		}
	}
	return true
}

// AmountCentsMax is the largest amount, in minor units, of one usage event or
// one customer's per-period cap (10^12).
const AmountCentsMax int64 = 1_000_000_000_000

// Now returns the ledger's clock reading (Config.Clock), for callers that
// must measure time the way the ledger does.
func (l *Ledger) Now() time.Time { return l.now() }
