package ledger

import (
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// The close burns credits down in its transaction, after rating: the
// grants that were valid when the period ended, locked, cover what they may
// of the charge's lines (applyCredits), and each grant applied is a credit
// line of the charge (a negative amount) and an applied entry of the grant.
// The charge is created once per period in that transaction, so a close run
// twice (a rescued job, two replicas) applies nothing twice; the entries'
// unique key (charge, grant) and their chain (each the next of its grant,
// never below zero: sql/migrations/00027_credits.sql) hold it in Postgres
// too.

// creditAvailable is a grant the close may apply, with what is left of it.
type creditAvailable struct {
	grantID   string
	metrics   []string // empty: covers every line
	remaining int64
	seq       int32 // the grant's last entry's
}

// creditsCutoff is the moment a closing period's grants are judged at: the
// period's end, or the close's time when it closes early. A grant applies
// when it was created by then and expires after.
const creditsCutoff = `(SELECT least(p.ends_at, $3::timestamptz) FROM billing.periods p WHERE p.customer_id = $1 AND p.period = $2)`

// creditsAvailableTx locks the grants of customerID in currency that the
// close of period (at now) may apply, in the order they apply (priority,
// earliest expiry, oldest), and reads what is left of each, in the next
// statement: one that began before a concurrent close committed would not
// see what that close applied. Both statements are sent with the
// transaction's next one.
func creditsAvailableTx(tx *Tx, customerID, period, currency string, now time.Time) *later[[]creditAvailable] {
	const valid = `g.customer_id = $1 AND g.currency = $4 AND g.created_at <= ` + creditsCutoff + `
  AND (g.expires_at IS NULL OR g.expires_at > ` + creditsCutoff + `)`
	const order = `ORDER BY g.priority, g.expires_at NULLS LAST, g.created_at, g.grant_id`
	tx.execLater(nil, `SELECT 1 FROM billing.credit_grants g WHERE `+valid+` `+order+` FOR UPDATE`,
		customerID, period, now, currency)
	return queryLater(tx, func(rows pgx.Rows) ([]creditAvailable, error) {
		var out []creditAvailable
		var c creditAvailable
		_, err := pgx.ForEachRow(rows, []any{&c.grantID, &c.metrics, &c.remaining, &c.seq}, func() error {
			out = append(out, creditAvailable{grantID: c.grantID, metrics: slices.Clone(c.metrics), remaining: c.remaining, seq: c.seq})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("error reading credit grants: %w", err)
		}
		return out, nil
	}, `
SELECT g.grant_id, coalesce(g.metrics, '{}'), last.remaining_cents, last.seq
FROM billing.credit_grants g`+creditLastEntry+`
WHERE `+valid+` AND last.remaining_cents > 0
`+order, customerID, period, now, currency)
}

// applyCredits applies grants, in their order, to lines: each grant covers,
// line by line, what earlier grants left of the lines it may cover (every
// line, or the usage lines of its metrics), up to what is left of it. It
// returns a credit line per grant applied (a negative amount, numbered
// after lines) and their total, positive.
func applyCredits(lines []ChargeLine, grants []creditAvailable) ([]ChargeLine, int64) {
	left := make([]int64, len(lines))
	for i, l := range lines {
		left[i] = l.AmountCents
	}
	var credits []ChargeLine
	var total int64
	for _, g := range grants {
		var applied int64
		for i, l := range lines {
			if left[i] == 0 || applied == g.remaining || !g.covers(l) {
				continue
			}
			take := min(left[i], g.remaining-applied)
			left[i] -= take
			applied += take
		}
		if applied == 0 {
			continue
		}
		c := ChargeLine{Line: int32(len(lines) + len(credits) + 1), Kind: ChargeLineCredit, AmountCents: -applied,
			GrantID: g.grantID}
		c.ExactAmount.SetInt64(-applied)
		credits, total = append(credits, c), total+applied
	}
	return credits, total
}

// covers reports whether the grant may pay for line l.
func (g creditAvailable) covers(l ChargeLine) bool {
	if len(g.metrics) == 0 {
		return true
	}
	return l.Kind == ChargeLineUsage && l.Usage != nil && slices.Contains(g.metrics, l.Usage.Metric)
}

// creditsAppliedInsertTx writes the applied entries of charge chargeID's
// credit lines, each the next in its grant's chain (available: the grants
// as the close read them). The statement is sent with the transaction's
// next one.
func creditsAppliedInsertTx(tx *Tx, customerID string, chargeID int64, credits []ChargeLine, available []creditAvailable,
	actor string, now time.Time) {
	if len(credits) == 0 {
		return
	}
	n := len(credits)
	grants, amounts, seqs, remaining := make([]string, n), make([]int64, n), make([]int32, n), make([]int64, n)
	for i, c := range credits {
		j := slices.IndexFunc(available, func(a creditAvailable) bool { return a.grantID == c.GrantID })
		grants[i], amounts[i] = c.GrantID, c.AmountCents
		seqs[i], remaining[i] = available[j].seq+1, available[j].remaining+c.AmountCents
	}
	tx.execLater(nil, `
INSERT INTO billing.credit_grant_entries (customer_id, grant_id, seq, kind, amount_cents, remaining_cents, charge_id, actor,
                                          created_at)
SELECT $1, a.grant_id, a.seq, 'applied', a.amount_cents, a.remaining_cents, $2, $3, $4
FROM unnest($5::text[], $6::integer[], $7::bigint[], $8::bigint[]) AS a (grant_id, seq, amount_cents, remaining_cents)`,
		customerID, chargeID, actor, now, grants, seqs, amounts, remaining)
}
