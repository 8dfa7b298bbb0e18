package ledger

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CloseGraceDefault is how long after a period's end late events are still
// accepted, when Config.CloseGrace is zero.
const CloseGraceDefault = time.Hour

// ChargeScheduler inserts the charge job of a (customer, period) in the
// caller's transaction, scheduled at runAt, and returns the job's id. It is
// implemented by internal/jobs (River's InsertTx with a unique job per
// customer and period), so the job commits or rolls back with the period row
// that asked for it: the transactional outbox.
type ChargeScheduler interface {
	ChargeJobInsertTx(ctx context.Context, tx pgx.Tx, customerID, period string, runAt time.Time) (jobID int64, err error)

	// ChargeJobRunNowTx makes the charge job with jobID available to run at
	// once, in the caller's transaction; a running job is left alone.
	ChargeJobRunNowTx(ctx context.Context, tx pgx.Tx, jobID int64) error
}

// Config configures a Ledger. Its zero value works except for ChargeScheduler,
// which ingest requires.
type Config struct {
	// Cadence is the length of billing periods. Default CadenceMonth.
	Cadence Cadence

	// CloseGrace is how long after its end a period still accepts late
	// events; it closes at end + CloseGrace. Default CloseGraceDefault.
	CloseGrace time.Duration

	// Clock returns the current time. Default time.Now.
	Clock func() time.Time

	// ChargeScheduler inserts charge jobs in ingest transactions.
	ChargeScheduler ChargeScheduler

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
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
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
	return nil
}

// Ledger runs Tally's domain operations against Postgres.
type Ledger struct {
	pool   *pgxpool.Pool
	config Config
	logger *slog.Logger
}

// New returns a Ledger using pool, or an error naming the invalid Config field.
func New(pool *pgxpool.Pool, config Config) (*Ledger, error) {
	config = config.WithDefaults()
	if err := config.validate(); err != nil {
		return nil, fmt.Errorf("invalid ledger config: %w", err)
	}
	return &Ledger{pool: pool, config: config, logger: config.Logger}, nil
}

// Cadence returns the configured billing period length.
func (l *Ledger) Cadence() Cadence { return l.config.Cadence }

// now is the one timestamp a transaction uses, rounded to Postgres's
// microsecond precision so what is returned equals what is stored.
func (l *Ledger) now() time.Time {
	return l.config.Clock().UTC().Truncate(time.Microsecond)
}

// txAttemptsMax bounds the retries of a transaction that Postgres aborted
// for a deadlock or a serialization failure.
const txAttemptsMax = 5

// withTx runs fn in a transaction and commits it, retrying the whole
// transaction when Postgres aborts it with a deadlock or serialization
// failure. fn must be safe to run again from the start.
func (l *Ledger) withTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	var err error
	for attempt := 1; attempt <= txAttemptsMax; attempt++ {
		err = pgx.BeginFunc(ctx, l.pool, fn)
		if !isRetryable(err) {
			return err
		}
		l.logger.WarnContext(ctx, "retrying transaction", slog.Int("attempt", attempt), slog.String("error", err.Error()))
	}
	return err
}

func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40P01" || pgErr.Code == "40001"
	}
	return false
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
