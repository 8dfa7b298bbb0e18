package ledger

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Holds are never silent: every transition into held logs one ERROR line with
// alert=charge_held, the charge, its reason and the command that moves it on
// (alertIfHeld); the reconciler reports again, once a day, every charge still
// held after a day (ChargeHeldReport).

// alertIfHeld logs the alert of a charge that has just moved into held.
func (l *Ledger) alertIfHeld(ctx context.Context, from ChargeStatus, c *Charge, actor string) {
	if c == nil || c.Status != ChargeHeld || from == ChargeHeld {
		return
	}
	l.logger.ErrorContext(ctx, "ALERT charge held: it waits for an operator", heldAttrs(c, actor)...)
}

// AlertIfHeld is alertIfHeld for a charge moved in a caller's transaction
// (ChargeReconcileTx), to be called once that transaction committed.
func (l *Ledger) AlertIfHeld(ctx context.Context, from ChargeStatus, c *Charge, actor string) {
	l.alertIfHeld(ctx, from, c, actor)
}

func heldAttrs(c *Charge, actor string) []any {
	var reason HeldReason
	var detail string
	if c.HeldReason != nil {
		reason = *c.HeldReason
	}
	if c.HeldDetail != nil {
		detail = *c.HeldDetail
	}
	return []any{AlertChargeHeld.Attr(), slog.Int64("charge_id", c.ID),
		slog.String("customer_id", c.CustomerID), slog.String("period", c.Period),
		slog.Int64("amount_cents", c.AmountCents), slog.String("currency", c.Currency),
		slog.String("held_reason", string(reason)), slog.String("held_detail", detail),
		slog.String("actor", actor), slog.String("exit", reason.Exit(c.ID))}
}

// HeldReportEvery is how often a charge that stays held is reported again.
const HeldReportEvery = 24 * time.Hour

// ChargeHeldReport logs the alert again for every charge held for longer than
// HeldReportEvery and not reported in the last HeldReportEvery, marks them
// reported, and returns how many it reported. The reconciler runs it.
func (l *Ledger) ChargeHeldReport(ctx context.Context) (int, error) {
	now := l.now()
	rows, err := l.pool.Query(ctx, `
UPDATE billing.charges SET held_alerted_at = $1
WHERE status = 'held' AND held_at < $2 AND (held_alerted_at IS NULL OR held_alerted_at < $2)
RETURNING `+chargeColumns, now, now.Add(-HeldReportEvery))
	if err != nil {
		return 0, fmt.Errorf("error reporting held charges: %w", err)
	}
	charges, err := collectCharges(rows)
	if err != nil {
		return 0, fmt.Errorf("error reporting held charges: %w", err)
	}
	for _, c := range charges {
		l.logger.ErrorContext(ctx, fmt.Sprintf("ALERT charge still held after %s: it waits for an operator",
			now.Sub(*c.HeldAt).Round(time.Minute)), heldAttrs(c, "reconciler")...)
	}
	return len(charges), nil
}

// ChargeHeldCount returns how many charges are held, by reason: the figure a
// metric exposes.
func (l *Ledger) ChargeHeldCount(ctx context.Context) (map[HeldReason]int64, error) {
	rows, err := l.pool.Query(ctx, `SELECT held_reason, count(*) FROM billing.charges WHERE status = 'held' GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("error counting held charges: %w", err)
	}
	defer rows.Close()
	counts := map[HeldReason]int64{}
	for rows.Next() {
		var r HeldReason
		var n int64
		if err := rows.Scan(&r, &n); err != nil {
			return nil, err
		}
		counts[r] = n
	}
	return counts, rows.Err()
}
