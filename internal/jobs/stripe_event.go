package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
	"github.com/tally-billing/tally/internal/stripeapi"
)

// QueueWebhooks is the queue of stripe_event jobs.
const QueueWebhooks = "webhooks"

// StripeEventArgs are the args of the job that processes one stored Stripe
// event; unique by event id.
type StripeEventArgs struct {
	EventID string `json:"event_id" river:"unique"`
}

// Kind is the River job kind, "stripe_event".
func (StripeEventArgs) Kind() string { return "stripe_event" }

// InsertOpts puts the job on QueueWebhooks, unique by event id.
func (StripeEventArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueWebhooks, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// StripeEventWorker applies a stored Stripe event to the ledger, in the same
// transaction that marks the event processed or ignored:
//
//   - payment_intent.succeeded / payment_failed / processing / canceled
//     settle the charge found by PaymentIntent id or metadata.tally_charge_key,
//     monotonically (a late processing never undoes succeeded);
//   - refund.created, refund.updated, charge.refund.updated, refund.failed
//     (and charge.refunded, when it lists its refunds) record the refund and
//     the status the event shows; charge.dispute.created, .updated, .closed,
//     .funds_withdrawn and .funds_reinstated the dispute and its status. Each
//     is a row per (object, event) in billing.refund_events or
//     billing.dispute_events; billing.refunds_current and
//     billing.disputes_current rank them, so a duplicated or late event never
//     moves a refund or dispute backwards;
//   - anything else, or a PaymentIntent Tally did not create, is ignored.
type StripeEventWorker struct {
	river.WorkerDefaults[StripeEventArgs]

	ledger *ledger.Ledger
	logger *slog.Logger

	// livemode is the mode of Tally's Stripe key: a PaymentIntent of the
	// other mode is never a charge's.
	livemode bool
}

// Work processes the event.
func (w *StripeEventWorker) Work(ctx context.Context, job *river.Job[StripeEventArgs]) error {
	return w.ledger.StripeEventHandle(ctx, job.Args.EventID, w.handle)
}

func (w *StripeEventWorker) handle(ctx context.Context, tx *ledger.Tx, ev *ledger.StripeEvent) (string, string, error) {
	var e stripe.Event
	if err := json.Unmarshal(ev.Payload, &e); err != nil {
		return "", "", fmt.Errorf("error decoding event: %w", err)
	}
	if e.Data == nil {
		return ledger.StripeEventIgnored, "event has no data.object", nil
	}
	actor := "webhook:" + ev.ID
	switch e.Type {
	case "payment_intent.succeeded", "payment_intent.payment_failed", "payment_intent.processing", "payment_intent.canceled":
		var pi stripe.PaymentIntent
		if err := json.Unmarshal(e.Data.Raw, &pi); err != nil {
			return "", "", fmt.Errorf("error decoding PaymentIntent: %w", err)
		}
		if ns := pi.Metadata["tally_namespace"]; ns != "" && ns != w.ledger.Namespace() {
			return ledger.StripeEventIgnored, "PaymentIntent " + pi.ID + " is namespace " + ns + "'s, another deployment's", nil
		}
		o := stripeapi.OutcomeOf(&pi)
		o.ResolvedBy = actor
		if key := pi.Metadata["tally_top_up_key"]; key != "" {
			return w.handleTopUp(ctx, tx, ev, &pi, key, o)
		}
		facts := paymentIntentFacts(&pi)
		applied, err := w.ledger.ChargeReconcileTx(ctx, tx, ledger.ChargeReconcileParams{
			ChargeKey: pi.Metadata["tally_charge_key"], Outcome: o, Actor: actor,
			PaymentIntent: &facts, Livemode: w.livemode,
		})
		if errors.Is(err, ledger.ErrNotFound) {
			return ledger.StripeEventIgnored, "PaymentIntent " + pi.ID + " is not Tally's", nil
		}
		if err != nil {
			return "", "", err
		}
		c := applied.Charge
		if applied.Changed {
			w.ledger.AlertIfHeld(ctx, "", c, actor)
		}
		if d := applied.DoubleCharge; d != nil {
			w.logger.ErrorContext(ctx, d.Alert(), ledger.AlertDoubleCharge.Attr(), slog.String("event_id", ev.ID))
			return ledger.StripeEventProcessed, d.Alert(), nil
		}
		w.logger.InfoContext(ctx, "stripe event applied", slog.String("event_id", ev.ID), slog.String("type", string(e.Type)),
			slog.Int64("charge_id", c.ID), slog.String("status", string(c.Status)), slog.Bool("changed", applied.Changed))
		return ledger.StripeEventProcessed, "", nil

	case "charge.refunded":
		var ch stripe.Charge
		if err := json.Unmarshal(e.Data.Raw, &ch); err != nil {
			return "", "", fmt.Errorf("error decoding Charge: %w", err)
		}
		if ch.Refunds == nil || len(ch.Refunds.Data) == 0 {
			// Current API versions leave the list out: refund.created records it.
			return ledger.StripeEventIgnored, "charge.refunded without refunds data; refund.created records the refund", nil
		}
		for _, r := range ch.Refunds.Data {
			p := refundParams(r, &e, ev.ID)
			p.StripeChargeID, p.StripePaymentIntentID = ch.ID, idOf(ch.PaymentIntent)
			_, err := w.ledger.RefundRecordTx(ctx, tx, p)
			if errors.Is(err, ledger.ErrNotFound) {
				return ledger.StripeEventIgnored, "charge " + ch.ID + " is not Tally's", nil
			}
			if err != nil {
				return "", "", err
			}
		}
		return ledger.StripeEventProcessed, "", nil

	case "refund.created", "refund.updated", "refund.failed", "charge.refund.updated":
		// Since API version 2022-11-15 charge.refunded carries no refunds
		// list; the Refund object comes in these events, and its later
		// status changes (pending → succeeded or failed, succeeded → failed)
		// in the updates.
		var re stripe.Refund
		if err := json.Unmarshal(e.Data.Raw, &re); err != nil {
			return "", "", fmt.Errorf("error decoding Refund: %w", err)
		}
		created, err := w.ledger.RefundRecordTx(ctx, tx, refundParams(&re, &e, ev.ID))
		if errors.Is(err, ledger.ErrNotFound) {
			return ledger.StripeEventIgnored, "refunded charge is not Tally's", nil
		}
		if err != nil {
			return "", "", err
		}
		w.logAdjustment(ctx, "refund", ev.ID, string(e.Type), re.ID, string(re.Status), created)
		return ledger.StripeEventProcessed, "", nil

	case "charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed",
		"charge.dispute.funds_withdrawn", "charge.dispute.funds_reinstated":
		var d stripe.Dispute
		if err := json.Unmarshal(e.Data.Raw, &d); err != nil {
			return "", "", fmt.Errorf("error decoding Dispute: %w", err)
		}
		p := ledger.ChargeAdjustmentParams{
			StripeID: d.ID, StripeChargeID: idOfCharge(d.Charge), StripePaymentIntentID: idOf(d.PaymentIntent),
			AmountCents: d.Amount, Currency: string(d.Currency), Status: string(d.Status), Reason: string(d.Reason),
			CreatedAt: time.Unix(d.Created, 0).UTC(), EventID: ev.ID, EventType: string(e.Type),
			EventCreatedAt: eventCreatedAt(&e),
		}
		if d.EvidenceDetails != nil && d.EvidenceDetails.DueBy > 0 {
			due := time.Unix(d.EvidenceDetails.DueBy, 0).UTC()
			p.EvidenceDueBy = &due
		}
		created, err := w.ledger.DisputeRecordTx(ctx, tx, p)
		if errors.Is(err, ledger.ErrNotFound) {
			return ledger.StripeEventIgnored, "disputed charge is not Tally's", nil
		}
		if err != nil {
			return "", "", err
		}
		w.logAdjustment(ctx, "dispute", ev.ID, string(e.Type), d.ID, string(d.Status), created)
		return ledger.StripeEventProcessed, "", nil
	}
	return ledger.StripeEventIgnored, "", nil
}

// refundParams is what event e (stored as eventID) shows of refund re.
func refundParams(re *stripe.Refund, e *stripe.Event, eventID string) ledger.ChargeAdjustmentParams {
	return ledger.ChargeAdjustmentParams{
		StripeID: re.ID, StripeChargeID: idOfCharge(re.Charge), StripePaymentIntentID: idOf(re.PaymentIntent),
		AmountCents: re.Amount, Currency: string(re.Currency), Status: string(re.Status), Reason: string(re.Reason),
		CreatedAt: time.Unix(re.Created, 0).UTC(), EventID: eventID, EventType: string(e.Type),
		EventCreatedAt: eventCreatedAt(e), FailureReason: string(re.FailureReason),
	}
}

// eventCreatedAt is when Stripe created event e (zero when it does not say).
func eventCreatedAt(e *stripe.Event) time.Time {
	if e.Created == 0 {
		return time.Time{}
	}
	return time.Unix(e.Created, 0).UTC()
}

// logAdjustment logs a refund's or dispute's status as an event showed it.
// A failed or canceled refund (the customer did not get the money back) and
// a dispute that needs a response or was lost are warnings.
func (w *StripeEventWorker) logAdjustment(ctx context.Context, object, eventID, eventType, objectID, status string, created bool) {
	level := slog.LevelInfo
	switch status {
	case "failed", "canceled", "needs_response", "warning_needs_response", "lost":
		level = slog.LevelWarn
	}
	w.logger.Log(ctx, level, "stripe event recorded a "+object+" status",
		slog.String("event_id", eventID), slog.String("type", eventType), slog.String("object_id", objectID),
		slog.String("status", status), slog.Bool("new", created))
}

func idOf(pi *stripe.PaymentIntent) string {
	if pi == nil {
		return ""
	}
	return pi.ID
}

func idOfCharge(ch *stripe.Charge) string {
	if ch == nil {
		return ""
	}
	return ch.ID
}

// handleTopUp applies a PaymentIntent event of a top-up (one that carries
// metadata.tally_top_up_key) in the event's transaction.
func (w *StripeEventWorker) handleTopUp(ctx context.Context, tx *ledger.Tx, ev *ledger.StripeEvent, pi *stripe.PaymentIntent,
	key string, o ledger.Outcome) (string, string, error) {
	facts := topUpPaymentIntentFacts(pi)
	t, changed, err := w.ledger.TopUpReconcileTx(ctx, tx, ledger.TopUpReconcileParams{
		Key: key, Outcome: o, PaymentIntent: &facts, Livemode: w.livemode, Actor: "webhook:" + ev.ID})
	if errors.Is(err, ledger.ErrNotFound) {
		return ledger.StripeEventIgnored, "PaymentIntent " + pi.ID + " carries a top-up key Tally does not hold", nil
	}
	if err != nil {
		return "", "", err
	}
	w.logger.InfoContext(ctx, "stripe event applied to a top-up", slog.String("event_id", ev.ID),
		slog.String("customer_id", t.CustomerID), slog.String("top_up_id", t.TopUpID), slog.String("status", string(t.Status)),
		slog.Bool("changed", changed))
	return ledger.StripeEventProcessed, "", nil
}
