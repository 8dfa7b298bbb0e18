package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-billing/tally/internal/pricing"
)

// PlanVersion is one version of a plan: an immutable price book, numbered
// from 1 per plan. (Not to be confused with plan.go, about query plans.)
type PlanVersion struct {
	PlanID  string
	Version int32
	// Plan is the version's content; its Currency is the plan's, the same in
	// every version.
	Plan pricing.Plan
	// PriceBook is Plan's canonical JSON (pricing.Plan.MarshalJSON) as
	// stored, {"currency":…,"prices":{…}}.
	PriceBook []byte
	CreatedAt time.Time
	// CreatedBy is who put the version: operator:<key name>/<key prefix> or
	// cli:<os user>.
	CreatedBy string
}

// PlanPutParams are the fields of PlanPut.
type PlanPutParams struct {
	PlanID string
	Plan   pricing.Plan
	// Actor is who puts the version (PlanVersion.CreatedBy); required.
	Actor string
}

// PlanPut stores p.Plan as the next version of plan p.PlanID (version 1 for
// a new plan) and returns it with created true. When p.Plan's canonical
// JSON equals the latest version's, it is a replay: nothing is written, and
// the latest version is returned with created false. A plan's currency is
// fixed by its first version. Concurrent puts of one plan are serialized
// (its billing.plans row is locked), so versions are numbered without gaps
// and a replay is recognized whatever the order.
//
// It returns a *pricing.ValidationError for an invalid plan and a
// *ValidationError for a bad plan_id or a currency other than the plan's. It
// commits its own transaction.
func (l *Ledger) PlanPut(ctx context.Context, p PlanPutParams) (*PlanVersion, bool, error) {
	fe := fieldErrors{}
	checkID(fe, "plan_id", p.PlanID, true)
	if p.Actor == "" {
		fe.add("actor", "is required: who puts the version")
	}
	if err := fe.err(); err != nil {
		return nil, false, err
	}
	book, err := p.Plan.MarshalJSON()
	if err != nil {
		return nil, false, err
	}
	var (
		v       *PlanVersion
		created bool
	)
	err = l.withTx(ctx, func(tx *Tx) error {
		now := l.now()
		v, created = nil, false
		tx.execLater(nil, `
INSERT INTO billing.plans (plan_id, currency, created_at, created_by) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING`, p.PlanID, p.Plan.Currency, now, p.Actor)
		// The lock, then the latest version in a statement of its own: one
		// that read it with the lock would see it as of before the wait.
		var currency string
		if err := tx.QueryRow(ctx, `
SELECT currency FROM billing.plans WHERE plan_id = $1 FOR NO KEY UPDATE`, p.PlanID).Scan(&currency); err != nil {
			return fmt.Errorf("error locking plan %s: %w", p.PlanID, err)
		}
		if currency != p.Plan.Currency {
			return &ValidationError{Fields: map[string]string{"currency": fmt.Sprintf(
				"must be %q, the currency of plan %s: a plan's currency cannot change; send %q, "+
					"or put the %s prices under a new plan_id", currency, p.PlanID, currency, p.Plan.Currency)}}
		}
		latest, err := scanPlanVersion(tx.QueryRow(ctx, `SELECT `+planVersionColumns+`
FROM billing.plan_versions WHERE plan_id = $1 ORDER BY version DESC LIMIT 1`, p.PlanID))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			latest = nil
		case err != nil:
			return fmt.Errorf("error reading the latest version of plan %s: %w", p.PlanID, err)
		}
		if latest != nil && string(latest.PriceBook) == string(book) {
			v = latest
			return nil
		}
		next := int32(1)
		if latest != nil {
			next = latest.Version + 1
		}
		// The version and its prices, one row per metric, derived from the
		// stored bytes in the same statement.
		if _, err := tx.Exec(ctx, `
WITH v AS (
  INSERT INTO billing.plan_versions (plan_id, version, currency, price_book, created_at, created_by)
  VALUES ($1, $2, $3, $4, $5, $6)
  RETURNING plan_id, version, price_book
)
INSERT INTO billing.plan_prices (plan_id, version, metric, model, price)
SELECT v.plan_id, v.version, e.key, e.value ->> 'model', e.value
FROM v, jsonb_each(v.price_book::jsonb -> 'prices') AS e`,
			p.PlanID, next, currency, string(book), now, p.Actor); err != nil {
			return fmt.Errorf("error storing version %d of plan %s: %w", next, p.PlanID, err)
		}
		v = &PlanVersion{PlanID: p.PlanID, Version: next, Plan: p.Plan, PriceBook: book, CreatedAt: now, CreatedBy: p.Actor}
		created = true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	if created {
		l.logger.InfoContext(ctx, "plan version created", slog.String("plan_id", v.PlanID),
			slog.Int("version", int(v.Version)), slog.String("actor", p.Actor))
	}
	return v, created, nil
}

const planVersionColumns = `plan_id, version, price_book, created_at, created_by`

func scanPlanVersion(row pgx.Row) (*PlanVersion, error) {
	var v PlanVersion
	var book string
	if err := row.Scan(&v.PlanID, &v.Version, &book, &v.CreatedAt, &v.CreatedBy); err != nil {
		return nil, err
	}
	plan, err := pricing.ParsePlan([]byte(book))
	if err != nil {
		return nil, fmt.Errorf("error decoding version %d of plan %s as stored: %w", v.Version, v.PlanID, err)
	}
	v.Plan, v.PriceBook = plan, []byte(book)
	return &v, nil
}

// PlanGet returns every version of a plan, oldest first, or ErrNotFound.
func (l *Ledger) PlanGet(ctx context.Context, planID string) ([]*PlanVersion, error) {
	if !ValidID(planID) {
		return nil, notFound("plan %q", planID)
	}
	rows, err := l.pool.Query(ctx, `SELECT `+planVersionColumns+`
FROM billing.plan_versions WHERE plan_id = $1 ORDER BY version`, planID)
	if err != nil {
		return nil, fmt.Errorf("error reading plan %s: %w", planID, err)
	}
	versions, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*PlanVersion, error) { return scanPlanVersion(r) })
	if err != nil {
		return nil, fmt.Errorf("error reading plan %s: %w", planID, err)
	}
	if len(versions) == 0 {
		return nil, notFound("plan %q", planID)
	}
	return versions, nil
}

// PlanListLimitDefault and PlanListLimitMax bound a page of PlanList.
const (
	PlanListLimitDefault = 50
	PlanListLimitMax     = 500
)

// PlanListParams page PlanList.
type PlanListParams struct {
	// StartingAfter is the cursor: the plan_id of the last plan of the
	// previous page. Empty: from the first.
	StartingAfter string

	// Limit is the page size. Default PlanListLimitDefault, at most
	// PlanListLimitMax.
	Limit int
}

// PlanList returns one page of plans, each as its latest version, by
// plan_id in byte order, and whether more follow; pass the last plan_id as
// StartingAfter for the next page. It returns a *ValidationError naming
// limit or starting_after.
func (l *Ledger) PlanList(ctx context.Context, p PlanListParams) ([]*PlanVersion, bool, error) {
	fe := fieldErrors{}
	if p.Limit < 0 || p.Limit > PlanListLimitMax {
		fe.add("limit", "must be between 1 and %d", PlanListLimitMax)
	}
	checkID(fe, "starting_after", p.StartingAfter, false)
	if err := fe.err(); err != nil {
		return nil, false, err
	}
	if p.Limit == 0 {
		p.Limit = PlanListLimitDefault
	}
	rows, err := l.pool.Query(ctx, `
SELECT v.plan_id, v.version, v.price_book, v.created_at, v.created_by
FROM billing.plans p
CROSS JOIN LATERAL (SELECT `+planVersionColumns+` FROM billing.plan_versions v
                    WHERE v.plan_id = p.plan_id ORDER BY v.version DESC LIMIT 1) v
WHERE p.plan_id COLLATE "C" > $1
ORDER BY p.plan_id COLLATE "C"
LIMIT $2`, p.StartingAfter, p.Limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("error listing plans: %w", err)
	}
	plans, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*PlanVersion, error) { return scanPlanVersion(r) })
	if err != nil {
		return nil, false, fmt.Errorf("error listing plans: %w", err)
	}
	more := len(plans) > p.Limit
	if more {
		plans = plans[:p.Limit]
	}
	return plans, more, nil
}
