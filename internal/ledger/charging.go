package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The kill switch: an operator pauses charging on every replica at once.
// The pause is River's pause of the charge queue (persisted in Postgres, so a
// replica that restarts stays paused): no charge or resolve job starts. A run
// already past its start meets the pause in its claim (ErrChargingPaused)
// and calls no one. Reads from Stripe (the reconciler) and webhooks go on.

// ErrChargingPaused is returned by ChargeClaim while charging is paused.
var ErrChargingPaused = errors.New("charging is paused")

// ChargingStatus is the kill switch's state. Paused is always River's
// queue's, whoever paused or resumed it; the operator log says who did it
// and why only when it agrees with the queue.
type ChargingStatus struct {
	Paused bool

	// Since is when charging was paused (River's own record) or last
	// resumed; By and Reason say who did it and why (empty when no operator
	// did: never paused, or paused or resumed outside Tally).
	Since  *time.Time
	By     string
	Reason string

	// Discrepancy, when not empty, says how the operator log disagrees with
	// River's queue — someone paused or resumed it outside Tally (River's
	// client, SQL) — and which command records the state. Empty when they
	// agree.
	Discrepancy string
}

// chargingQueuePausedAt is the key of a charging_pause action's detail
// that holds when River's queue was paused, so a later read can tell the
// pause it recorded from a pause made outside Tally since.
const chargingQueuePausedAt = "queue_paused_at"

// chargingPausedTx returns ErrChargingPaused while charging is paused.
func (l *Ledger) chargingPausedTx(ctx context.Context, tx *Tx) error {
	if l.config.Scheduler == nil {
		return nil
	}
	since, err := l.config.Scheduler.ChargingPausedTx(ctx, tx)
	if err != nil {
		return fmt.Errorf("error reading the kill switch: %w", err)
	}
	if since != nil {
		return ErrChargingPaused
	}
	return nil
}

// ChargingGet returns the kill switch's state.
func (l *Ledger) ChargingGet(ctx context.Context) (*ChargingStatus, error) {
	var st *ChargingStatus
	err := l.withTx(ctx, func(tx *Tx) error {
		var err error
		st, err = l.chargingGetTx(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (l *Ledger) chargingGetTx(ctx context.Context, tx *Tx) (*ChargingStatus, error) {
	if l.config.Scheduler == nil {
		return nil, errors.New("no scheduler configured: the kill switch lives in River's queue table")
	}
	pausedAt, err := l.config.Scheduler.ChargingPausedTx(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("error reading the kill switch: %w", err)
	}
	st := &ChargingStatus{Paused: pausedAt != nil, Since: pausedAt}
	last, err := scanOperatorAction(tx.QueryRow(ctx, `SELECT `+operatorActionColumns+`
FROM billing.operator_actions
WHERE action IN ('charging_pause', 'charging_resume') ORDER BY id DESC LIMIT 1`))
	if errors.Is(err, pgx.ErrNoRows) {
		last, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("error reading the last pause or resume: %w", err)
	}
	switch {
	case st.Paused && last != nil && last.Action == ActionChargingPause && chargingPauseIs(last, *pausedAt):
		st.By, st.Reason = last.Actor, last.Reason
	case !st.Paused && last != nil && last.Action == ActionChargingResume:
		st.By, st.Reason, st.Since = last.Actor, last.Reason, &last.CreatedAt
	case !st.Paused && last == nil:
		// Never paused.
	case st.Paused:
		st.Discrepancy = fmt.Sprintf("River's charge queue was paused at %s outside Tally (River's client or SQL): "+
			"no operator action says who paused it or why; record it with billingctl charging pause --reason \"…\" "+
			"(it stays paused), or resume with billingctl charging resume --reason \"…\"", pausedAt.UTC().Format(time.RFC3339))
	default:
		st.Discrepancy = fmt.Sprintf("charging was paused by %s at %s (%q), but River's charge queue is not paused: "+
			"it was resumed outside Tally (River's client or SQL), and no operator action says who resumed it or why; "+
			"record it with billingctl charging resume --reason \"…\", or pause again with billingctl charging pause --reason \"…\"",
			last.Actor, last.CreatedAt.UTC().Format(time.RFC3339), last.Reason)
	}
	return st, nil
}

// chargingPauseIs reports whether the recorded pause a is the queue's pause
// of pausedAt: false when the queue was resumed and paused again outside
// Tally since. A pause recorded without the queue's time (before Tally kept
// it) is taken to be the queue's.
func chargingPauseIs(a *OperatorAction, pausedAt time.Time) bool {
	recorded, ok := a.Detail[chargingQueuePausedAt].(string)
	if !ok {
		return true
	}
	t, err := time.Parse(time.RFC3339Nano, recorded)
	return err == nil && t.Equal(pausedAt)
}

// ChargingPause pauses charging on every replica (see ErrChargingPaused) and
// records the operator action; pausing a paused switch records the action
// and changes nothing. It commits and returns the new state.
func (l *Ledger) ChargingPause(ctx context.Context, actor, reason string) (*ChargingStatus, error) {
	return l.chargingSet(ctx, true, actor, reason)
}

// ChargingResume resumes charging and records the operator action.
func (l *Ledger) ChargingResume(ctx context.Context, actor, reason string) (*ChargingStatus, error) {
	return l.chargingSet(ctx, false, actor, reason)
}

func (l *Ledger) chargingSet(ctx context.Context, pause bool, actor, reason string) (*ChargingStatus, error) {
	if err := checkReason(reason); err != nil {
		return nil, err
	}
	var st *ChargingStatus
	err := l.withTx(ctx, func(tx *Tx) error {
		action := ActionChargingResume
		set := l.config.Scheduler.ChargingResumeTx
		if pause {
			action, set = ActionChargingPause, l.config.Scheduler.ChargingPauseTx
		}
		if err := set(ctx, tx); err != nil {
			return err
		}
		a := OperatorAction{Action: action, Actor: actor, Reason: reason}
		if pause {
			// River keeps the first pause's time: a pause of a queue paused
			// outside Tally records that pause as this operator's.
			pausedAt, err := l.config.Scheduler.ChargingPausedTx(ctx, tx)
			if err != nil {
				return fmt.Errorf("error reading the kill switch: %w", err)
			}
			if pausedAt != nil {
				a.Detail = map[string]any{chargingQueuePausedAt: pausedAt.Format(time.RFC3339Nano)}
			}
		}
		if _, err := operatorActionTx(ctx, tx, l.now(), a); err != nil {
			return err
		}
		var err error
		st, err = l.chargingGetTx(ctx, tx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("error setting the kill switch: %w", err)
	}
	return st, nil
}

// ChargingPausedAlertAfter is how long charging may stay paused before the
// reconciler alerts, on every run, that no money moves.
const ChargingPausedAlertAfter = time.Hour

// ChargingReport logs the kill switch's alerts and reports whether it
// logged one. The reconciler runs it, so neither goes unnoticed:
//   - ERROR alert=charging_paused (with who paused, why, since when and the
//     command that resumes) when charging has been paused for longer than
//     after;
//   - ERROR alert=charging_discrepancy (with what the queue and the operator
//     log say) when River's queue was paused or resumed outside Tally, so the
//     operator log does not say who or why (ChargingStatus.Discrepancy).
func (l *Ledger) ChargingReport(ctx context.Context, after time.Duration) (bool, error) {
	st, err := l.ChargingGet(ctx)
	if err != nil {
		return false, err
	}
	reported := false
	if st.Discrepancy != "" {
		l.logger.ErrorContext(ctx, "ALERT charging was paused or resumed outside Tally: the operator log does not say who or why",
			AlertChargingDiscrepancy.Attr(), "paused", st.Paused, "discrepancy", st.Discrepancy)
		reported = true
	}
	// Since is River's own record, on Postgres's clock: compare with the
	// wall clock, not the ledger's (test) clock.
	if st.Paused && st.Since != nil && time.Since(*st.Since) >= after {
		l.logger.ErrorContext(ctx, "ALERT charging is paused: no charge or refund moves money on any replica",
			AlertChargingPaused.Attr(), "paused_since", st.Since.UTC().Format(time.RFC3339), "paused_by", st.By,
			"reason", st.Reason, "exit", `billingctl charging resume --reason "…"`)
		reported = true
	}
	return reported, nil
}
