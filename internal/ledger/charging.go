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

// ChargingStatus is the kill switch's state.
type ChargingStatus struct {
	Paused bool

	// Since is when charging was paused (River's own record) or last
	// resumed; By and Reason say who did it and why (empty when no operator
	// ever did).
	Since  *time.Time
	By     string
	Reason string
}

// chargingPausedTx returns ErrChargingPaused while charging is paused.
func (l *Ledger) chargingPausedTx(ctx context.Context, tx pgx.Tx) error {
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
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		var err error
		st, err = l.chargingGetTx(ctx, tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (l *Ledger) chargingGetTx(ctx context.Context, tx pgx.Tx) (*ChargingStatus, error) {
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
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("error reading the last pause or resume: %w", err)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case st.Paused && last.Action == ActionChargingPause:
		st.By, st.Reason = last.Actor, last.Reason
	case !st.Paused && last.Action == ActionChargingResume:
		st.By, st.Reason, st.Since = last.Actor, last.Reason, &last.CreatedAt
	case st.Paused:
		st.By = "outside Tally (River's queue was paused directly)"
	}
	return st, nil
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
	err := l.withTx(ctx, func(tx pgx.Tx) error {
		action := ActionChargingResume
		set := l.config.Scheduler.ChargingResumeTx
		if pause {
			action, set = ActionChargingPause, l.config.Scheduler.ChargingPauseTx
		}
		if err := set(ctx, tx); err != nil {
			return err
		}
		if _, err := operatorActionTx(ctx, tx, l.now(), OperatorAction{Action: action, Actor: actor, Reason: reason}); err != nil {
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

// ChargingPausedReport logs an ERROR alert (alert=charging_paused, with who
// paused, why, since when and the command that resumes) when charging has been
// paused for longer than after, and reports whether it did. The reconciler
// runs it, so a forgotten pause never goes unnoticed.
func (l *Ledger) ChargingPausedReport(ctx context.Context, after time.Duration) (bool, error) {
	st, err := l.ChargingGet(ctx)
	if err != nil {
		return false, err
	}
	// Since is River's own record, on Postgres's clock: compare with the
	// wall clock, not the ledger's (test) clock.
	if !st.Paused || st.Since == nil || time.Since(*st.Since) < after {
		return false, nil
	}
	l.logger.ErrorContext(ctx, "ALERT charging is paused: no charge or refund moves money on any replica",
		"alert", "charging_paused", "paused_since", st.Since.UTC().Format(time.RFC3339), "paused_by", st.By,
		"reason", st.Reason, "exit", `billingctl charging resume --reason "…"`)
	return true, nil
}
