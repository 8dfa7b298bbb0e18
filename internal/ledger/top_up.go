package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Top-ups: a customer buys credits with a PaymentIntent (billing.top_ups).
// The row commits pending, with its River job, before any money moves; the
// job leases it (TopUpClaim), looks on Stripe for a PaymentIntent carrying
// its key before every call, calls with that key, and records the answer
// (TopUpRecordOutcome). The grant it buys is written in the transaction
// that records the PaymentIntent's success, under the top-up's row lock, so
// a top-up buys at most one grant whoever records the success first: its
// job, a webhook (TopUpReconcileTx) or a later run's look-up.

// TopUpStatus is where a top-up stands.
type TopUpStatus string

// Top-up statuses. Succeeded, failed and canceled are terminal; a failed
// one still takes the success of its own PaymentIntent (Stripe says the
// money moved, so the ledger must).
const (
	TopUpPending    TopUpStatus = "pending"    // committed; Stripe not answered yet
	TopUpProcessing TopUpStatus = "processing" // the PaymentIntent is processing: a webhook or the job's poll settles it
	TopUpUnknown    TopUpStatus = "unknown"    // the call's outcome is unknown: the job looks, then calls again with the same key
	TopUpSucceeded  TopUpStatus = "succeeded"  // paid; its grant exists
	TopUpFailed     TopUpStatus = "failed"     // Stripe declined it, or the customer must act
	TopUpHeld       TopUpStatus = "held"       // a guard or an answer a human must look at (alert top_up_held)
	TopUpCanceled   TopUpStatus = "canceled"   // an operator canceled it; no PaymentIntent of it can succeed
)

// TopUpStatuses lists every top-up status (the API's enum).
var TopUpStatuses = []TopUpStatus{TopUpPending, TopUpProcessing, TopUpUnknown, TopUpSucceeded, TopUpFailed, TopUpHeld, TopUpCanceled}

// Terminal reports whether s is final.
func (s TopUpStatus) Terminal() bool {
	return s == TopUpSucceeded || s == TopUpFailed || s == TopUpCanceled
}

// Top-up sources.
const (
	TopUpSourceAPI      = "api"      // POST /v1/customers/{id}/top-ups
	TopUpSourceRecharge = "recharge" // the customer's automatic recharge
)

// TopUpRechargePrefix starts the top_up_id of every automatic recharge
// ("recharge-<n>"); TopUpCreate refuses it.
const TopUpRechargePrefix = "recharge-"

// TopUpGrantPrefix starts the grant_id of every grant a top-up bought
// ("top_up:" + top_up_id); CreditGrantCreate refuses it.
const TopUpGrantPrefix = "top_up:"

// TopUp is a purchase of credits.
type TopUp struct {
	ID                    int64
	CustomerID            string
	TopUpID               string
	Source                string
	Status                TopUpStatus
	AmountCents           int64
	Currency              string
	Category              CreditCategory
	Priority              int32
	GrantExpiresAt        *time.Time
	StripeCustomerID      string
	StripePaymentMethodID *string
	// Key is the top-up's metadata.tally_top_up_key (TopUpKey), the same
	// for every key generation, and the idempotency key of generation 0.
	Key           string
	KeyNamespace  string
	KeyGeneration int
	// GenerationFirstAttemptedAt is when the current key generation was
	// first claimed for a call: Stripe keeps a key 24 h from its first use.
	GenerationFirstAttemptedAt *time.Time

	StripePaymentIntentID *string
	StripeChargeID        *string
	FailureCode           *string
	FailureMessage        *string
	HeldReason            *HeldReason
	ResolvedBy            *string
	LeaseOwner            *string
	LeaseExpiresAt        *time.Time
	LeaseLeft             time.Duration
	AttemptCount          int
	FirstAttemptedAt      *time.Time
	LastAttemptedAt       *time.Time
	JobID                 *int64
	CreatedAt             time.Time
	CreatedBy             string
	UpdatedAt             time.Time
	CanceledBy            *string
	CancelReason          *string
}

// GrantID is the grant_id of the grant the top-up buys.
func (t *TopUp) GrantID() string { return TopUpGrantPrefix + t.TopUpID }

// LeaseLive reports whether a run holds the top-up's lease now.
func (t *TopUp) LeaseLive() bool { return t.LeaseOwner != nil && t.LeaseLeft > 0 }

// IdempotencyKey is the Stripe idempotency key of the top-up's current key
// generation: Key for generation 0, then
// hex(sha256("tally:topup:v1:" + namespace + ":" + customer + ":" + top_up_id + ":" + generation)).
func (t *TopUp) IdempotencyKey() string {
	if t.KeyGeneration == 0 {
		return t.Key
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("tally:topup:v1:%s:%s:%s:%d", t.KeyNamespace, t.CustomerID, t.TopUpID, t.KeyGeneration)))
	return hex.EncodeToString(sum[:])
}

// TopUpKey is the key of top-up topUpID of customerID in namespace:
// hex(sha256("tally:topup:v1:" + namespace + ":" + customer + ":" + top_up_id)).
func TopUpKey(namespace, customerID, topUpID string) string {
	sum := sha256.Sum256([]byte("tally:topup:v1:" + namespace + ":" + customerID + ":" + topUpID))
	return hex.EncodeToString(sum[:])
}

const topUpColumns = `id, customer_id, top_up_id, source, status, amount_cents, currency, category, priority,
       grant_expires_at, stripe_customer_id, stripe_payment_method_id, top_up_key, key_namespace,
       key_generation, generation_first_attempted_at, stripe_payment_intent_id, stripe_charge_id, failure_code, failure_message, held_reason, resolved_by,
       lease_owner, lease_expires_at, greatest(extract(epoch FROM lease_expires_at - now()), 0)::float8,
       attempt_count, first_attempted_at, last_attempted_at, job_id, created_at, created_by, updated_at,
       canceled_by, cancel_reason`

func scanTopUp(row pgx.Row) (*TopUp, error) {
	var t TopUp
	var left float64
	err := row.Scan(&t.ID, &t.CustomerID, &t.TopUpID, &t.Source, &t.Status, &t.AmountCents, &t.Currency, &t.Category,
		&t.Priority, &t.GrantExpiresAt, &t.StripeCustomerID, &t.StripePaymentMethodID, &t.Key, &t.KeyNamespace,
		&t.KeyGeneration, &t.GenerationFirstAttemptedAt, &t.StripePaymentIntentID, &t.StripeChargeID, &t.FailureCode, &t.FailureMessage, &t.HeldReason, &t.ResolvedBy,
		&t.LeaseOwner, &t.LeaseExpiresAt, &left, &t.AttemptCount, &t.FirstAttemptedAt, &t.LastAttemptedAt, &t.JobID,
		&t.CreatedAt, &t.CreatedBy, &t.UpdatedAt, &t.CanceledBy, &t.CancelReason)
	if err != nil {
		return nil, err
	}
	t.LeaseLeft = time.Duration(left * float64(time.Second))
	return &t, nil
}

// PublicTopUp is a top-up as the public API shows it, in its answers and in
// the notifications about it.
type PublicTopUp struct {
	CustomerID            string     `json:"customer_id"`
	TopUpID               string     `json:"top_up_id"`
	Source                string     `json:"source"`
	Status                string     `json:"status"`
	AmountCents           int64      `json:"amount_cents"`
	Currency              string     `json:"currency"`
	Category              string     `json:"category"`
	Priority              int32      `json:"priority"`
	GrantExpiresAt        *time.Time `json:"grant_expires_at"`
	GrantID               *string    `json:"grant_id"`
	StripePaymentIntentID *string    `json:"stripe_payment_intent_id"`
	FailureCode           *string    `json:"failure_code"`
	FailureMessage        *string    `json:"failure_message"`
	HeldReason            *string    `json:"held_reason"`
	AttemptCount          int        `json:"attempt_count"`
	CreatedAt             time.Time  `json:"created_at"`
	CreatedBy             string     `json:"created_by"`
	UpdatedAt             time.Time  `json:"updated_at"`
}

// Public is t as the public API shows it.
func (t *TopUp) Public() PublicTopUp {
	p := PublicTopUp{CustomerID: t.CustomerID, TopUpID: t.TopUpID, Source: t.Source, Status: string(t.Status),
		AmountCents: t.AmountCents, Currency: t.Currency, Category: string(t.Category), Priority: t.Priority,
		GrantExpiresAt: t.GrantExpiresAt, StripePaymentIntentID: t.StripePaymentIntentID, FailureCode: t.FailureCode,
		FailureMessage: t.FailureMessage, AttemptCount: t.AttemptCount, CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy,
		UpdatedAt: t.UpdatedAt}
	if t.Status == TopUpSucceeded {
		g := t.GrantID()
		p.GrantID = &g
	}
	if t.HeldReason != nil {
		r := string(*t.HeldReason)
		p.HeldReason = &r
	}
	return p
}

// TopUpParams are the fields of TopUpCreate.
type TopUpParams struct {
	CustomerID  string
	TopUpID     string
	AmountCents int64
	// Currency is the customer's when empty; any other is refused.
	Currency string
	// Category, Priority and GrantExpiresAt are the terms of the grant the
	// top-up buys: CreditPaid and CreditPriorityDefault when zero, no
	// expiry when nil.
	Category       CreditCategory
	Priority       *int32
	GrantExpiresAt *time.Time
	// Actor is who buys: operator:<key name>/<key prefix> or cli:<os user>.
	Actor string
}

// TopUpCreate commits a pending top-up and its job, idempotent on
// (customer, top_up_id): it returns the top-up and true when it wrote it,
// the stored one and false on a replay, and a *ConflictError
// top_up_id_reused when that top_up_id holds other terms. It returns a
// *ValidationError for a bad field and a *NotFoundError for an unknown
// customer.
func (l *Ledger) TopUpCreate(ctx context.Context, p TopUpParams) (*TopUp, bool, error) {
	now := l.now()
	fe := fieldErrors{}
	checkID(fe, "customer_id", p.CustomerID, true)
	checkID(fe, "top_up_id", p.TopUpID, true)
	if n := len(p.TopUpID); n > idMaxBytes-len(TopUpGrantPrefix) && n <= idMaxBytes {
		fe.add("top_up_id", "is %d bytes long; send at most %d bytes (its grant is named %q + top_up_id)",
			n, idMaxBytes-len(TopUpGrantPrefix), TopUpGrantPrefix)
	}
	if strings.HasPrefix(p.TopUpID, TopUpRechargePrefix) {
		fe.add("top_up_id", "must not start with %q: that names the customer's automatic recharges", TopUpRechargePrefix)
	}
	if p.Currency != "" {
		checkCurrency(fe, "currency", p.Currency)
	}
	if p.Category == "" {
		p.Category = CreditPaid
	}
	if p.Category != CreditPaid && p.Category != CreditPromotional {
		fe.add("category", "must be \"paid\" (the default for a top-up) or \"promotional\"; got %q", p.Category)
	}
	priority := int32(CreditPriorityDefault)
	if p.Priority != nil {
		priority = *p.Priority
		if priority < 0 || priority > CreditPriorityMax {
			fe.add("priority", "must be from 0 (applied first) to %d; got %d", CreditPriorityMax, priority)
		}
	}
	if p.GrantExpiresAt != nil && !p.GrantExpiresAt.After(now) {
		fe.add("grant_expires_at", "must be in the future; leave it out for credits that do not expire")
	}
	if p.Actor == "" {
		fe.add("actor", "is required: who buys the credits")
	}
	if err := fe.err(); err != nil {
		return nil, false, err
	}
	want := TopUp{CustomerID: p.CustomerID, TopUpID: p.TopUpID, Source: TopUpSourceAPI, AmountCents: p.AmountCents,
		Currency: strings.ToLower(p.Currency), Category: p.Category, Priority: priority, CreatedBy: p.Actor}
	if p.GrantExpiresAt != nil {
		e := p.GrantExpiresAt.UTC().Truncate(time.Microsecond)
		want.GrantExpiresAt = &e
	}
	var t *TopUp
	var created bool
	err := l.withTx(ctx, func(tx *Tx) error {
		var err error
		t, created, err = l.topUpInsertTx(ctx, tx, now, want)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("error creating top-up %q of customer %q: %w", p.TopUpID, p.CustomerID, err)
	}
	return t, created, nil
}

// topUpInsertTx inserts top-up want (pending) with its job and its first
// transition, or returns the stored one (a *ConflictError when its terms
// differ). want's amount is checked against Stripe's limits in the
// customer's currency.
func (l *Ledger) topUpInsertTx(ctx context.Context, tx *Tx, now time.Time, want TopUp) (*TopUp, bool, error) {
	var currency string
	err := tx.QueryRow(ctx, `SELECT currency FROM billing.customers WHERE customer_id = $1`, want.CustomerID).Scan(&currency)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, notFound("customer %q", want.CustomerID)
	}
	if err != nil {
		return nil, false, fmt.Errorf("error reading customer: %w", err)
	}
	fe := fieldErrors{}
	if want.Currency != "" && want.Currency != currency {
		fe.add("currency", "is %q, but customer %q is billed in %q: a top-up buys credits in the customer's currency (leave it out)",
			want.Currency, want.CustomerID, currency)
	}
	want.Currency = currency
	if min := AmountMinCents(currency); want.AmountCents < min || want.AmountCents > AmountMaxCents {
		fe.add("amount_cents", "must be from %d (Stripe's minimum in %s) to %d (its largest PaymentIntent); got %d",
			min, currency, AmountMaxCents, want.AmountCents)
	}
	if err := fe.err(); err != nil {
		return nil, false, err
	}
	var id int64
	err = tx.QueryRow(ctx, `
INSERT INTO billing.top_ups (customer_id, top_up_id, source, status, amount_cents, currency, category, priority,
                             grant_expires_at, stripe_customer_id, stripe_payment_method_id, top_up_key, key_namespace,
                             created_at, created_by, updated_at)
SELECT customer_id, $2, $3, 'pending', $4, currency, $5, $6, $7, stripe_customer_id, stripe_payment_method_id, $8, $9,
       $10, $11, $10
FROM billing.customers WHERE customer_id = $1
ON CONFLICT DO NOTHING
RETURNING id`, want.CustomerID, want.TopUpID, want.Source, want.AmountCents, want.Category, want.Priority,
		want.GrantExpiresAt, TopUpKey(l.Namespace(), want.CustomerID, want.TopUpID), l.Namespace(), now, want.CreatedBy).Scan(&id)
	// ON CONFLICT names no index: the top-up key is unique too and derived
	// from (customer_id, top_up_id), and a concurrent post of the same
	// top-up can meet it first, which a conflict target of (customer_id,
	// top_up_id) alone turns into an error (TestTopUpCreateConcurrent).
	created := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, false, fmt.Errorf("error inserting top-up: %w", err)
	}
	if created {
		if l.config.Scheduler == nil {
			return nil, false, errors.New("no scheduler to run the top-up's job with")
		}
		jobID, err := l.config.Scheduler.TopUpJobInsertTx(ctx, tx, want.CustomerID, want.TopUpID)
		if err != nil {
			return nil, false, err
		}
		tx.execLater(nil, `UPDATE billing.top_ups SET job_id = $2 WHERE id = $1`, id, jobID)
		topUpTransitionTx(tx, now, id, want.CustomerID, "", TopUpPending, want.CreatedBy,
			fmt.Sprintf("%s top-up of %d %s", want.Source, want.AmountCents, want.Currency))
	}
	t, err := topUpGetTx(ctx, tx, want.CustomerID, want.TopUpID, false)
	if err != nil {
		return nil, false, err
	}
	if !created && !t.sameTerms(want) {
		return nil, false, &ConflictError{Code: ConflictTopUpIDReused, Detail: fmt.Sprintf(
			"top-up %q of customer %q exists with other terms (%d %s, %s, priority %d); choose a new top_up_id",
			t.TopUpID, t.CustomerID, t.AmountCents, t.Currency, t.Category, t.Priority)}
	}
	return t, created, nil
}

// sameTerms reports whether t buys what want asks for.
func (t *TopUp) sameTerms(want TopUp) bool {
	sameExpiry := (t.GrantExpiresAt == nil) == (want.GrantExpiresAt == nil) &&
		(t.GrantExpiresAt == nil || t.GrantExpiresAt.Equal(*want.GrantExpiresAt))
	return t.AmountCents == want.AmountCents && t.Currency == want.Currency && t.Category == want.Category &&
		t.Priority == want.Priority && sameExpiry && t.Source == want.Source
}

// topUpGetTx reads a top-up in tx, locked FOR UPDATE when lock is set, or
// returns ErrNotFound.
func topUpGetTx(ctx context.Context, tx *Tx, customerID, topUpID string, lock bool) (*TopUp, error) {
	q := `SELECT ` + topUpColumns + ` FROM billing.top_ups WHERE customer_id = $1 AND top_up_id = $2`
	if lock {
		q += ` FOR UPDATE`
	}
	t, err := scanTopUp(tx.QueryRow(ctx, q, customerID, topUpID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("top-up %q of customer %q", topUpID, customerID)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading top-up: %w", err)
	}
	return t, nil
}

// TopUpGet returns top-up topUpID of customerID, or ErrNotFound.
func (l *Ledger) TopUpGet(ctx context.Context, customerID, topUpID string) (*TopUp, error) {
	t, err := scanTopUp(l.pool.QueryRow(ctx, `SELECT `+topUpColumns+` FROM billing.top_ups
WHERE customer_id = $1 AND top_up_id = $2`, customerID, topUpID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("top-up %q of customer %q", topUpID, customerID)
	}
	if err != nil {
		return nil, fmt.Errorf("error reading top-up %q of customer %q: %w", topUpID, customerID, err)
	}
	return t, nil
}

// TopUpListParams page a customer's top-ups, newest first.
type TopUpListParams struct {
	CustomerID string
	Limit      int
	// StartingAfter is the top_up_id of the last top-up of the previous
	// page.
	StartingAfter string
}

// TopUpList returns a page of a customer's top-ups, newest first, and
// whether more follow. It returns ErrNotFound for an unknown customer or
// StartingAfter.
func (l *Ledger) TopUpList(ctx context.Context, p TopUpListParams) ([]*TopUp, bool, error) {
	if p.Limit <= 0 {
		p.Limit = 50
	}
	var out []*TopUp
	err := l.withTx(ctx, func(tx *Tx) error {
		var one int
		if err := tx.QueryRow(ctx, `SELECT 1 FROM billing.customers WHERE customer_id = $1`, p.CustomerID).Scan(&one); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return notFound("customer %q", p.CustomerID)
			}
			return err
		}
		after := int64(1<<63 - 1)
		if p.StartingAfter != "" {
			t, err := topUpGetTx(ctx, tx, p.CustomerID, p.StartingAfter, false)
			if err != nil {
				return err
			}
			after = t.ID
		}
		rows, err := tx.Query(ctx, `SELECT `+topUpColumns+` FROM billing.top_ups
WHERE customer_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3`, p.CustomerID, after, p.Limit+1)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (*TopUp, error) { return scanTopUp(r) })
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("error listing top-ups of customer %q: %w", p.CustomerID, err)
	}
	more := len(out) > p.Limit
	if more {
		out = out[:p.Limit]
	}
	return out, more, nil
}

// topUpTransitionTx logs the move of top-up id of customerID from status
// from ("" on creation) to to, with the notification it sends; the
// statement goes with the transaction's next one.
func topUpTransitionTx(tx *Tx, now time.Time, id int64, customerID string, from, to TopUpStatus, actor, reason string) {
	var f, r *string
	if from != "" {
		s := string(from)
		f = &s
	}
	if reason != "" {
		r = &reason
	}
	tx.execLater(nil, `
INSERT INTO billing.top_up_transitions (top_up, customer_id, from_status, to_status, reason, actor, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)`, id, customerID, f, to, r, actor, now)
	if from == to {
		return
	}
	switch to {
	case TopUpSucceeded:
		recordNotice(tx, notice{typ: NotifyTopUpSucceeded, topUp: id})
	case TopUpFailed:
		recordNotice(tx, notice{typ: NotifyTopUpFailed, topUp: id})
	}
}
