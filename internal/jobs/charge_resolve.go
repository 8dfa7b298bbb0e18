package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v76"

	"github.com/tally-billing/tally/internal/ledger"
)

// ChargeResolveArgs are the args of the job that carries out an operator's
// resolve of a double charge (ledger.ChargeResolveRequest).
type ChargeResolveArgs ledger.ChargeResolveJob

// Kind is the River job kind, "charge_resolve".
func (ChargeResolveArgs) Kind() string { return "charge_resolve" }

// InsertOpts puts the job on QueueCharges: refunds move money, so the kill
// switch stops them too.
func (ChargeResolveArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueCharges, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// ChargeResolveWorker carries out a resolve: it lists the PaymentIntents that
// carry the charge's key, checks that the one to keep is among them and
// succeeded, refunds in full every other succeeded one (with an idempotency
// key derived from (charge, PaymentIntent), so a retried resolve never
// refunds twice), records the refunds, and settles the charge as succeeded
// with the kept PaymentIntent. Every step is safe to run again.
type ChargeResolveWorker struct {
	river.WorkerDefaults[ChargeResolveArgs]

	ledger *ledger.Ledger
	stripe Stripe
	logger *slog.Logger
}

// RefundIdempotencyKey is the Stripe idempotency key of the refund of
// PaymentIntent pi by the resolve of charge chargeID.
func RefundIdempotencyKey(chargeID int64, pi string) string {
	sum := sha256.Sum256([]byte("tally:refund:v1:" + strconv.FormatInt(chargeID, 10) + ":" + pi))
	return hex.EncodeToString(sum[:])
}

// Work carries out the resolve of job.Args.
func (w *ChargeResolveWorker) Work(ctx context.Context, job *river.Job[ChargeResolveArgs]) error {
	args := ledger.ChargeResolveJob(job.Args)
	logger := w.logger.With(slog.Int64("charge_id", args.ChargeID), slog.String("keep_payment_intent", args.KeepPaymentIntent),
		slog.Int64("job_id", job.ID))
	st, err := w.ledger.ChargingGet(ctx)
	if err != nil {
		return err
	}
	if st.Paused {
		return river.JobSnooze(chargingPausedSnooze)
	}
	c, err := w.ledger.ChargeGet(ctx, args.ChargeID)
	if err != nil {
		return err
	}
	ownSucceeded := c.Status == ledger.ChargeSucceeded && c.StripePaymentIntentID != nil && *c.StripePaymentIntentID == args.KeepPaymentIntent
	if c.Status != ledger.ChargeHeld && !ownSucceeded {
		logger.InfoContext(ctx, "charge already resolved", slog.String("status", string(c.Status)))
		return nil
	}
	pis, err := chargePaymentIntents(ctx, w.stripe, c)
	if err != nil {
		return err
	}
	var keep *stripe.PaymentIntent
	for _, pi := range pis {
		if pi.ID == args.KeepPaymentIntent {
			keep = pi
		}
	}
	if keep == nil || keep.Status != stripe.PaymentIntentStatusSucceeded {
		logger.ErrorContext(ctx, "ALERT resolve refused: the PaymentIntent to keep does not carry the charge's key or did not succeed; the charge stays held",
			ledger.AlertChargeHeld.Attr(), slog.Any("payment_intents", paymentIntentIDs(pis)))
		return river.JobCancel(fmt.Errorf("PaymentIntent %s is not a succeeded PaymentIntent of charge %d (found: %v)",
			args.KeepPaymentIntent, c.ID, paymentIntentIDs(pis)))
	}
	for _, pi := range pis {
		if pi.ID == keep.ID || pi.Status != stripe.PaymentIntentStatusSucceeded {
			continue
		}
		// The kill switch stops refunds too, even in a run already going.
		if st, err := w.ledger.ChargingGet(ctx); err != nil || st.Paused {
			if err != nil {
				return err
			}
			return river.JobSnooze(chargingPausedSnooze)
		}
		params := &stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Reason: stripe.String(string(stripe.RefundReasonDuplicate))}
		params.AddMetadata("tally_charge_key", c.ChargeKey)
		params.AddMetadata("charge_id", strconv.FormatInt(c.ID, 10))
		params.SetIdempotencyKey(RefundIdempotencyKey(c.ID, pi.ID))
		r, err := w.stripe.RefundCreate(ctx, params)
		var se *stripe.Error
		if errors.As(err, &se) && se.Code == stripe.ErrorCodeChargeAlreadyRefunded {
			// Refunded already (by hand in the Dashboard, or by a run whose
			// key Stripe has forgotten): nothing more to give back.
			logger.WarnContext(ctx, "second PaymentIntent of a double charge was already refunded", slog.String("payment_intent", pi.ID))
			continue
		}
		if err != nil {
			return fmt.Errorf("error refunding %s of charge %d: %w", pi.ID, c.ID, err)
		}
		var stripeCharge string
		if r.Charge != nil {
			stripeCharge = r.Charge.ID
		}
		if _, err := w.ledger.RefundRecordResolve(ctx, c.ID, ledger.ChargeAdjustmentParams{
			StripeID: r.ID, StripeChargeID: stripeCharge, StripePaymentIntentID: pi.ID, AmountCents: r.Amount,
			Currency: string(r.Currency), Status: string(r.Status), Reason: string(r.Reason), CreatedAt: time.Unix(r.Created, 0).UTC(),
		}); err != nil {
			return err
		}
		logger.WarnContext(ctx, "refunded a second PaymentIntent of a double charge", slog.String("payment_intent", pi.ID),
			slog.String("refund", r.ID), slog.Int64("amount_cents", r.Amount))
	}
	var keepCharge string
	if keep.LatestCharge != nil {
		keepCharge = keep.LatestCharge.ID
	}
	if keep.Amount != c.AmountCents || string(keep.Currency) != c.Currency {
		logger.ErrorContext(ctx, "ALERT resolve keeps a PaymentIntent for another amount than the ledger's: tell finance",
			ledger.AlertResolveAmountDiffers.Attr(), slog.Int64("payment_intent_amount", keep.Amount),
			slog.String("payment_intent_currency", string(keep.Currency)), slog.Int64("charge_amount_cents", c.AmountCents))
	}
	settled, err := w.ledger.ChargeResolveSettle(ctx, args, keepCharge)
	if err != nil {
		return err
	}
	logger.InfoContext(ctx, "double charge resolved", slog.String("status", string(settled.Status)))
	return nil
}

// chargingPausedSnooze is how long a job that meets the kill switch waits
// before it looks again.
const chargingPausedSnooze = 10 * time.Second
