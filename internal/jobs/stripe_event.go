package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
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
//   - refund.created (and charge.refunded, when it lists its refunds) appends
//     the refund, charge.dispute.created the dispute;
//   - anything else, or a PaymentIntent Tally did not create, is ignored.
type StripeEventWorker struct {
	river.WorkerDefaults[StripeEventArgs]

	ledger *ledger.Ledger
	logger *slog.Logger
}

// Work processes the event.
func (w *StripeEventWorker) Work(ctx context.Context, job *river.Job[StripeEventArgs]) error {
	return w.ledger.StripeEventHandle(ctx, job.Args.EventID, w.handle)
}

func (w *StripeEventWorker) handle(ctx context.Context, tx pgx.Tx, ev *ledger.StripeEvent) (string, string, error) {
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
		o := outcomeFromPaymentIntent(&pi)
		o.ResolvedBy = actor
		c, changed, err := w.ledger.ChargeResolveTx(ctx, tx, ledger.ChargeResolveParams{
			ChargeKey: pi.Metadata["tally_charge_key"], Outcome: o, Actor: actor,
		})
		var double *ledger.DoubleChargeError
		switch {
		case errors.Is(err, ledger.ErrNotFound):
			return ledger.StripeEventIgnored, "PaymentIntent " + pi.ID + " is not Tally's", nil
		case errors.As(err, &double):
			w.logger.ErrorContext(ctx, double.Error(), slog.String("event_id", ev.ID))
			return ledger.StripeEventProcessed, double.Error(), nil
		case err != nil:
			return "", "", err
		}
		if changed {
			w.ledger.AlertIfHeld(ctx, "", c, actor)
		}
		w.logger.InfoContext(ctx, "stripe event applied", slog.String("event_id", ev.ID), slog.String("type", string(e.Type)),
			slog.Int64("charge_id", c.ID), slog.String("status", string(c.Status)), slog.Bool("changed", changed))
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
			_, err := w.ledger.RefundRecordTx(ctx, tx, ledger.ChargeAdjustmentParams{
				StripeID: r.ID, StripeChargeID: ch.ID, StripePaymentIntentID: idOf(ch.PaymentIntent),
				AmountCents: r.Amount, Currency: string(r.Currency), Status: string(r.Status), Reason: string(r.Reason),
				CreatedAt: time.Unix(r.Created, 0).UTC(), EventID: ev.ID,
			})
			if errors.Is(err, ledger.ErrNotFound) {
				return ledger.StripeEventIgnored, "charge " + ch.ID + " is not Tally's", nil
			}
			if err != nil {
				return "", "", err
			}
		}
		return ledger.StripeEventProcessed, "", nil

	case "refund.created", "charge.refund.updated":
		// Since API version 2022-11-15 charge.refunded carries no refunds
		// list; the Refund object comes in these events.
		var re stripe.Refund
		if err := json.Unmarshal(e.Data.Raw, &re); err != nil {
			return "", "", fmt.Errorf("error decoding Refund: %w", err)
		}
		_, err := w.ledger.RefundRecordTx(ctx, tx, ledger.ChargeAdjustmentParams{
			StripeID: re.ID, StripeChargeID: idOfCharge(re.Charge), StripePaymentIntentID: idOf(re.PaymentIntent),
			AmountCents: re.Amount, Currency: string(re.Currency), Status: string(re.Status), Reason: string(re.Reason),
			CreatedAt: time.Unix(re.Created, 0).UTC(), EventID: ev.ID,
		})
		if errors.Is(err, ledger.ErrNotFound) {
			return ledger.StripeEventIgnored, "refunded charge is not Tally's", nil
		}
		if err != nil {
			return "", "", err
		}
		return ledger.StripeEventProcessed, "", nil

	case "charge.dispute.created":
		var d stripe.Dispute
		if err := json.Unmarshal(e.Data.Raw, &d); err != nil {
			return "", "", fmt.Errorf("error decoding Dispute: %w", err)
		}
		_, err := w.ledger.DisputeRecordTx(ctx, tx, ledger.ChargeAdjustmentParams{
			StripeID: d.ID, StripeChargeID: idOfCharge(d.Charge), StripePaymentIntentID: idOf(d.PaymentIntent),
			AmountCents: d.Amount, Currency: string(d.Currency), Status: string(d.Status), Reason: string(d.Reason),
			CreatedAt: time.Unix(d.Created, 0).UTC(), EventID: ev.ID,
		})
		if errors.Is(err, ledger.ErrNotFound) {
			return ledger.StripeEventIgnored, "disputed charge is not Tally's", nil
		}
		if err != nil {
			return "", "", err
		}
		return ledger.StripeEventProcessed, "", nil
	}
	return ledger.StripeEventIgnored, "", nil
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
