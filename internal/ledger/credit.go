package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Prepaid credits: a grant gives a customer an amount in one currency
// (billing.credit_grants), and everything that happens to it afterwards is
// an entry with a signed amount (billing.credit_grant_entries): granted,
// applied to a charge by its close (credit_burn.go), expired, voided. What
// is left of a grant is the sum of its entries, never below zero. The
// entries of a grant are a chain (seq, remaining_cents after each), which
// Postgres holds with constraints; each writer of an entry locks the
// grant's row first, then reads its last entry (creditGrantLastTx) in the
// next statement, and appends the next.

// CreditCategory says what a grant is, for finance.
type CreditCategory string

// Credit categories.
const (
	CreditPaid        CreditCategory = "paid"        // bought: a top-up, or sold outside Tally
	CreditPromotional CreditCategory = "promotional" // given away
)

// CreditEntryKind is what an entry records.
type CreditEntryKind string

// Entry kinds. Only granted adds; the others take from what is left.
const (
	CreditGranted CreditEntryKind = "granted"
	CreditApplied CreditEntryKind = "applied" // by a charge's close, to its lines
	CreditExpired CreditEntryKind = "expired" // left unused at expires_at (breakage)
	CreditVoided  CreditEntryKind = "voided"  // left unused when an operator voided the grant
)

// CreditGrantStatus is where a grant stands, derived from its entries and
// its expiry.
type CreditGrantStatus string

// Grant statuses.
const (
	GrantActive  CreditGrantStatus = "active"  // something is left, and it has not expired
	GrantUsedUp  CreditGrantStatus = "used_up" // applied in full
	GrantExpired CreditGrantStatus = "expired" // past expires_at
	GrantVoided  CreditGrantStatus = "voided"  // voided by an operator
)

// CreditPriorityDefault is a grant's priority when none is given.
const CreditPriorityDefault = 50

// CreditPriorityMax is the largest priority (lower applies first).
const CreditPriorityMax = 1000

// creditMetricsMax bounds the metrics a grant may be scoped to.
const creditMetricsMax = 100

// CreditGrant is a grant with what is left of it.
type CreditGrant struct {
	CustomerID  string
	GrantID     string
	AmountCents int64
	Currency    string
	Category    CreditCategory
	Priority    int32
	ExpiresAt   *time.Time
	// Metrics, when not empty, are the only metrics whose usage lines the
	// grant covers; empty covers every line.
	Metrics   []string
	CreatedAt time.Time
	CreatedBy string

	// RemainingCents is the sum of the grant's entries.
	RemainingCents int64
	Status         CreditGrantStatus
}

// PublicCreditGrant is a grant as the public API shows it, in its answers
// and in the notifications about it.
type PublicCreditGrant struct {
	CustomerID     string     `json:"customer_id"`
	GrantID        string     `json:"grant_id"`
	AmountCents    int64      `json:"amount_cents"`
	RemainingCents int64      `json:"remaining_cents"`
	Currency       string     `json:"currency"`
	Category       string     `json:"category"`
	Priority       int32      `json:"priority"`
	ExpiresAt      *time.Time `json:"expires_at"`
	Metrics        []string   `json:"metrics"`
	Status         string     `json:"status"`
	CreatedAt      time.Time  `json:"created_at"`
	CreatedBy      string     `json:"created_by"`
}

// Public is g as the public API shows it.
func (g *CreditGrant) Public() PublicCreditGrant {
	metrics := g.Metrics
	if metrics == nil {
		metrics = []string{}
	}
	return PublicCreditGrant{CustomerID: g.CustomerID, GrantID: g.GrantID, AmountCents: g.AmountCents,
		RemainingCents: g.RemainingCents, Currency: g.Currency, Category: string(g.Category), Priority: g.Priority,
		ExpiresAt: g.ExpiresAt, Metrics: metrics, Status: string(g.Status), CreatedAt: g.CreatedAt, CreatedBy: g.CreatedBy}
}

// CreditEntry is one entry of a grant.
type CreditEntry struct {
	ID          int64
	CustomerID  string
	GrantID     string
	Kind        CreditEntryKind
	AmountCents int64
	ChargeID    *int64
	Reason      *string
	Actor       string
	CreatedAt   time.Time
}

// CreditGrantParams are the fields of CreditGrantCreate.
type CreditGrantParams struct {
	CustomerID  string
	GrantID     string
	AmountCents int64
	Currency    string
	Category    CreditCategory
	// Priority is 0 to CreditPriorityMax; nil is CreditPriorityDefault.
	Priority  *int32
	ExpiresAt *time.Time
	Metrics   []string
	// Actor is who grants: operator:<key name>/<key prefix> or cli:<os user>.
	Actor string
}

// CreditGrantCreate grants credits to a customer, idempotent on
// (customer, grant_id): it returns the grant and true when it wrote it, the
// grant as stored and false when the same grant exists already (a replay),
// and a *ConflictError grant_id_reused when that grant_id holds another
// grant. It returns a *ValidationError for a bad field and a
// *NotFoundError for an unknown customer.
func (l *Ledger) CreditGrantCreate(ctx context.Context, p CreditGrantParams) (*CreditGrant, bool, error) {
	fe := fieldErrors{}
	checkID(fe, "customer_id", p.CustomerID, true)
	checkID(fe, "grant_id", p.GrantID, true)
	if strings.HasPrefix(p.GrantID, TopUpGrantPrefix) {
		fe.add("grant_id", "must not start with %q: that names the grants top-ups buy (POST /v1/customers/{id}/top-ups)",
			TopUpGrantPrefix)
	}
	if p.AmountCents <= 0 || p.AmountCents > AmountCentsMax {
		fe.add("amount_cents", "must be a whole number of minor units from 1 to %d", AmountCentsMax)
	}
	checkCurrency(fe, "currency", p.Currency)
	if p.Category != CreditPaid && p.Category != CreditPromotional {
		fe.add("category", "must be \"paid\" (bought) or \"promotional\" (given away); got %q", p.Category)
	}
	priority := int32(CreditPriorityDefault)
	if p.Priority != nil {
		priority = *p.Priority
		if priority < 0 || priority > CreditPriorityMax {
			fe.add("priority", "must be from 0 (applied first) to %d; got %d", CreditPriorityMax, priority)
		}
	}
	now := l.now()
	if p.ExpiresAt != nil && !p.ExpiresAt.After(now) {
		fe.add("expires_at", "must be in the future; leave it out for a grant that does not expire")
	}
	metrics := slices.Clone(p.Metrics)
	slices.Sort(metrics)
	metrics = slices.Compact(metrics)
	if len(metrics) > creditMetricsMax {
		fe.add("metrics", "names %d metrics; a grant may cover at most %d (leave it out to cover every line)", len(metrics), creditMetricsMax)
	}
	for _, m := range metrics {
		if !ValidID(m) {
			fe.add("metrics", "must be metric names of 1 to %d bytes of UTF-8 without control characters", idMaxBytes)
			break
		}
	}
	if p.Actor == "" {
		fe.add("actor", "is required: who grants the credits")
	}
	if err := fe.err(); err != nil {
		return nil, false, err
	}
	var expires *time.Time
	if p.ExpiresAt != nil {
		e := p.ExpiresAt.UTC().Truncate(time.Microsecond)
		expires = &e
	}
	want := CreditGrant{CustomerID: p.CustomerID, GrantID: p.GrantID, AmountCents: p.AmountCents, Currency: p.Currency,
		Category: p.Category, Priority: priority, ExpiresAt: expires, Metrics: metrics}
	var g *CreditGrant
	var created bool
	err := l.withTx(ctx, func(tx *Tx) error {
		var err error
		g, created, err = creditGrantCreateTx(ctx, tx, now, want, p.Actor)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("error granting credits %q to customer %q: %w", p.GrantID, p.CustomerID, err)
	}
	return g, created, nil
}

// creditGrantCreateTx inserts grant want with its granted entry, or returns
// the stored grant when (customer, grant_id) exists (a *ConflictError when
// it differs from want).
func creditGrantCreateTx(ctx context.Context, tx *Tx, now time.Time, want CreditGrant, actor string) (*CreditGrant, bool, error) {
	var metrics []string
	if len(want.Metrics) > 0 {
		metrics = want.Metrics
	}
	tag, err := tx.Exec(ctx, `
INSERT INTO billing.credit_grants (customer_id, grant_id, amount_cents, currency, category, priority, expires_at,
                                   metrics, created_at, created_by)
SELECT customer_id, $2, $3, $4, $5, $6, $7, $8, $9, $10 FROM billing.customers WHERE customer_id = $1
ON CONFLICT (customer_id, grant_id) DO NOTHING`,
		want.CustomerID, want.GrantID, want.AmountCents, want.Currency, want.Category, want.Priority, want.ExpiresAt,
		metrics, now, actor)
	if err != nil {
		return nil, false, fmt.Errorf("error inserting grant: %w", err)
	}
	created := tag.RowsAffected() == 1
	if created {
		tx.execLater(nil, `
INSERT INTO billing.credit_grant_entries (customer_id, grant_id, seq, kind, amount_cents, remaining_cents, actor, created_at)
VALUES ($1, $2, 1, 'granted', $3, $3, $4, $5)`, want.CustomerID, want.GrantID, want.AmountCents, actor, now)
		rechargeRearmTx(tx, want.CustomerID, now)
	}
	g, err := creditGrantGetTx(ctx, tx, now, want.CustomerID, want.GrantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, notFound("customer %q", want.CustomerID)
	}
	if err != nil {
		return nil, false, err
	}
	if !created && !g.sameTerms(want) {
		return nil, false, &ConflictError{Code: ConflictGrantIDReused, Detail: fmt.Sprintf(
			"grant %q of customer %q exists with other terms (%d %s, %s, priority %d); choose a new grant_id, "+
				"or void the grant (POST /v1/customers/{id}/credit-grants/{grant_id}/void) and grant again",
			g.GrantID, g.CustomerID, g.AmountCents, g.Currency, g.Category, g.Priority)}
	}
	return g, created, nil
}

// sameTerms reports whether g grants what want asks for.
func (g *CreditGrant) sameTerms(want CreditGrant) bool {
	sameExpiry := (g.ExpiresAt == nil) == (want.ExpiresAt == nil) && (g.ExpiresAt == nil || g.ExpiresAt.Equal(*want.ExpiresAt))
	return g.AmountCents == want.AmountCents && g.Currency == want.Currency && g.Category == want.Category &&
		g.Priority == want.Priority && sameExpiry && slices.Equal(g.Metrics, want.Metrics)
}

// creditLastEntry joins each grant g to its last entry, last: what is left
// of it (remaining_cents) and what last happened to it (kind). Every read
// of what is left of a grant goes through it.
const creditLastEntry = `
CROSS JOIN LATERAL (SELECT e.id, e.seq, e.kind, e.remaining_cents FROM billing.credit_grant_entries e
                    WHERE e.customer_id = g.customer_id AND e.grant_id = g.grant_id
                    ORDER BY e.seq DESC LIMIT 1) last`

const creditGrantColumns = `g.customer_id, g.grant_id, g.amount_cents, g.currency, g.category, g.priority, g.expires_at,
       coalesce(g.metrics, '{}'), g.created_at, g.created_by, last.remaining_cents, last.kind = 'voided'`

// scanCreditGrant scans creditGrantColumns, as of now.
func scanCreditGrant(row pgx.Row, now time.Time) (*CreditGrant, error) {
	var g CreditGrant
	var voided bool
	err := row.Scan(&g.CustomerID, &g.GrantID, &g.AmountCents, &g.Currency, &g.Category, &g.Priority, &g.ExpiresAt,
		&g.Metrics, &g.CreatedAt, &g.CreatedBy, &g.RemainingCents, &voided)
	if err != nil {
		return nil, err
	}
	switch {
	case voided:
		g.Status = GrantVoided
	case g.ExpiresAt != nil && !now.Before(*g.ExpiresAt):
		g.Status = GrantExpired
	case g.RemainingCents == 0:
		g.Status = GrantUsedUp
	default:
		g.Status = GrantActive
	}
	return &g, nil
}

func creditGrantGetTx(ctx context.Context, tx *Tx, now time.Time, customerID, grantID string) (*CreditGrant, error) {
	return scanCreditGrant(tx.QueryRow(ctx, `SELECT `+creditGrantColumns+`
FROM billing.credit_grants g`+creditLastEntry+`
WHERE g.customer_id = $1 AND g.grant_id = $2`, customerID, grantID), now)
}

// CreditGrantVoidParams are the fields of CreditGrantVoid.
type CreditGrantVoidParams struct {
	CustomerID string
	GrantID    string
	// Reason says why: 1 to ReasonMaxChars characters, as an operator
	// action's.
	Reason string
	Actor  string
}

// CreditGrantVoid ends what is left of a grant: a voided entry of minus
// what remains, attributed. What was applied stays applied (the usage was
// consumed). Voiding a voided grant is a replay: its void is returned, and
// false. A grant with nothing left (used up, expired) cannot be voided: a
// *ConflictError grant_exhausted.
func (l *Ledger) CreditGrantVoid(ctx context.Context, p CreditGrantVoidParams) (*CreditEntry, bool, error) {
	if err := checkReason(p.Reason); err != nil {
		return nil, false, err
	}
	fe := fieldErrors{}
	checkID(fe, "customer_id", p.CustomerID, true)
	checkID(fe, "grant_id", p.GrantID, true)
	if p.Actor == "" {
		fe.add("actor", "is required: who voids the grant")
	}
	if err := fe.err(); err != nil {
		return nil, false, err
	}
	var entry *CreditEntry
	var created bool
	err := l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		// Lock, then read what is left: the lock waits for a close applying
		// the grant (or another void), and the next statement sees it.
		var one int
		err := tx.QueryRow(ctx, `
SELECT 1 FROM billing.credit_grants WHERE customer_id = $1 AND grant_id = $2 FOR UPDATE`, p.CustomerID, p.GrantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("grant %q of customer %q", p.GrantID, p.CustomerID)
		}
		if err != nil {
			return fmt.Errorf("error locking grant: %w", err)
		}
		last, err := creditGrantLastTx(ctx, tx, p.CustomerID, p.GrantID)
		if err != nil {
			return err
		}
		voided := last.id // a void is a grant's last entry: nothing is left after it
		if last.kind != CreditVoided {
			if last.remaining == 0 {
				return &ConflictError{Code: ConflictGrantExhausted, Detail: fmt.Sprintf(
					"grant %q of customer %q has nothing left to void (used up or expired); see its entries at GET /v1/customers/{id}/credits",
					p.GrantID, p.CustomerID)}
			}
			err = tx.QueryRow(ctx, `
INSERT INTO billing.credit_grant_entries (customer_id, grant_id, seq, kind, amount_cents, remaining_cents, reason, actor, created_at)
VALUES ($1, $2, $3, 'voided', $4, 0, $5, $6, $7) RETURNING id`,
				p.CustomerID, p.GrantID, last.seq+1, -last.remaining, p.Reason, p.Actor, now).Scan(&voided)
			if err != nil {
				return fmt.Errorf("error voiding grant: %w", err)
			}
			created = true
		}
		entry, err = scanCreditEntry(tx.QueryRow(ctx, `SELECT `+creditEntryColumns+`
FROM billing.credit_grant_entries WHERE id = $1`, voided))
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("error voiding grant %q of customer %q: %w", p.GrantID, p.CustomerID, err)
	}
	return entry, created, nil
}

// creditLast is a grant's last entry: its id and number in the chain, its
// kind, and what is left after it.
type creditLast struct {
	id        int64
	seq       int32
	kind      CreditEntryKind
	remaining int64
}

// creditGrantLastTx reads grant (customerID, grantID)'s last entry. Call it
// once the grant is locked, in a statement after the lock's: it sees every
// entry committed before.
func creditGrantLastTx(ctx context.Context, tx *Tx, customerID, grantID string) (creditLast, error) {
	var last creditLast
	err := tx.QueryRow(ctx, `
SELECT last.id, last.seq, last.kind, last.remaining_cents FROM billing.credit_grants g`+creditLastEntry+`
WHERE g.customer_id = $1 AND g.grant_id = $2`, customerID, grantID).Scan(&last.id, &last.seq, &last.kind, &last.remaining)
	if err != nil {
		return last, fmt.Errorf("error reading grant %q's last entry: %w", grantID, err)
	}
	return last, nil
}

const creditEntryColumns = `id, customer_id, grant_id, kind, amount_cents, charge_id, reason, actor, created_at`

func scanCreditEntry(row pgx.Row) (*CreditEntry, error) {
	var e CreditEntry
	err := row.Scan(&e.ID, &e.CustomerID, &e.GrantID, &e.Kind, &e.AmountCents, &e.ChargeID, &e.Reason, &e.Actor, &e.CreatedAt)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// CreditBalance is what is left of a customer's grants of one currency and
// category that still apply (not expired, not voided).
type CreditBalance struct {
	Currency       string
	Category       CreditCategory
	RemainingCents int64
}

// Credits is a customer's credits: balances, every grant, and a page of
// entries.
type Credits struct {
	Balances []CreditBalance
	Grants   []*CreditGrant
	Entries  []*CreditEntry
	// EntriesMore is set when entries after the last one exist.
	EntriesMore bool
}

// CreditEntriesLimitMax bounds a page of entries.
const CreditEntriesLimitMax = 500

// CreditsParams are the fields of CustomerCredits.
type CreditsParams struct {
	CustomerID string
	// EntriesAfter pages the entries: those with an id above it, oldest
	// first.
	EntriesAfter int64
	// EntriesLimit is 1 to CreditEntriesLimitMax; 0 is 100.
	EntriesLimit int
}

// CustomerCredits returns a customer's credits, or a *NotFoundError.
func (l *Ledger) CustomerCredits(ctx context.Context, p CreditsParams) (*Credits, error) {
	if !ValidID(p.CustomerID) {
		return nil, notFound("customer %q", p.CustomerID)
	}
	limit := p.EntriesLimit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, CreditEntriesLimitMax)
	now := l.now()
	var out Credits
	err := l.withTx(ctx, func(tx *Tx) error {
		out = Credits{}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM billing.customers WHERE customer_id = $1)`, p.CustomerID).Scan(&exists); err != nil {
			return fmt.Errorf("error reading customer: %w", err)
		}
		if !exists {
			return notFound("customer %q", p.CustomerID)
		}
		rows, err := tx.Query(ctx, `SELECT `+creditGrantColumns+`
FROM billing.credit_grants g`+creditLastEntry+`
WHERE g.customer_id = $1
ORDER BY g.priority, g.expires_at NULLS LAST, g.created_at, g.grant_id`, p.CustomerID)
		if err != nil {
			return fmt.Errorf("error reading grants: %w", err)
		}
		out.Grants, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (*CreditGrant, error) { return scanCreditGrant(row, now) })
		if err != nil {
			return fmt.Errorf("error reading grants: %w", err)
		}
		rows, err = tx.Query(ctx, `SELECT `+creditEntryColumns+`
FROM billing.credit_grant_entries WHERE customer_id = $1 AND id > $2 ORDER BY id LIMIT $3`, p.CustomerID, p.EntriesAfter, limit+1)
		if err != nil {
			return fmt.Errorf("error reading entries: %w", err)
		}
		out.Entries, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (*CreditEntry, error) { return scanCreditEntry(row) })
		if err != nil {
			return fmt.Errorf("error reading entries: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error reading the credits of customer %q: %w", p.CustomerID, err)
	}
	if len(out.Entries) > limit {
		out.Entries, out.EntriesMore = out.Entries[:limit], true
	}
	for _, g := range out.Grants {
		if g.Status != GrantActive {
			continue
		}
		i := slices.IndexFunc(out.Balances, func(b CreditBalance) bool { return b.Currency == g.Currency && b.Category == g.Category })
		if i < 0 {
			out.Balances = append(out.Balances, CreditBalance{Currency: g.Currency, Category: g.Category})
			i = len(out.Balances) - 1
		}
		out.Balances[i].RemainingCents += g.RemainingCents
	}
	slices.SortFunc(out.Balances, func(a, b CreditBalance) int {
		return strings.Compare(a.Currency+"/"+string(a.Category), b.Currency+"/"+string(b.Category))
	})
	return &out, nil
}
