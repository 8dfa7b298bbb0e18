package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Notification types: what Tally tells the producer through its webhook
// endpoints (GitHub issue 14). NotificationTypes lists every one an endpoint
// may subscribe to; "*" subscribes to all.
const (
	NotifyChargeSucceeded      = "charge.succeeded"
	NotifyChargeFailed         = "charge.failed"
	NotifyChargePastDue        = "charge.past_due"
	NotifyChargeUncollectible  = "charge.uncollectible"
	NotifyChargeHeld           = "charge.held"
	NotifyChargeCarriedForward = "charge.carried_forward"
	NotifyChargeCanceled       = "charge.canceled"
	NotifyChargeRefunded       = "charge.refunded"
	NotifyChargeDisputed       = "charge.disputed"
	NotifyPeriodClosed         = "period.closed"
	NotifyUsageThreshold       = "usage.threshold_reached"
	NotifyCreditGrantExpired   = "credit.grant_expired"
	NotifyCreditBalanceLow     = "credit.balance_low"
	NotifyTopUpSucceeded       = "top_up.succeeded"
	NotifyTopUpFailed          = "top_up.failed"

	// NotifyAll subscribes an endpoint to every type.
	NotifyAll = "*"
)

// NotificationTypes are the types an endpoint may subscribe to.
var NotificationTypes = []string{
	NotifyChargeSucceeded, NotifyChargeFailed, NotifyChargePastDue, NotifyChargeUncollectible,
	NotifyChargeHeld, NotifyChargeCarriedForward, NotifyChargeCanceled, NotifyChargeRefunded,
	NotifyChargeDisputed, NotifyPeriodClosed, NotifyUsageThreshold, NotifyCreditGrantExpired,
	NotifyCreditBalanceLow, NotifyTopUpSucceeded, NotifyTopUpFailed,
}

// NotificationAPIVersion is the version of the objects a notification
// carries: the public API's.
const NotificationAPIVersion = "v1"

// chargeNotification is the type a charge's move to status sends, or "".
func chargeNotification(status ChargeStatus) string {
	switch status {
	case ChargeSucceeded:
		return NotifyChargeSucceeded
	case ChargeFailed:
		return NotifyChargeFailed
	case ChargeHeld:
		return NotifyChargeHeld
	case ChargeCarriedForward:
		return NotifyChargeCarriedForward
	case ChargeCanceled:
		return NotifyChargeCanceled
	case ChargePastDue:
		return NotifyChargePastDue
	case ChargeUncollectible:
		return NotifyChargeUncollectible
	}
	return ""
}

// notice is a change a transaction made that a notification reports, once
// the transaction is about to commit (notifyTx): the object is read then, as
// the transaction leaves it.
type notice struct {
	typ        string
	chargeID   int64  // charge.* notices
	customerID string // period.closed, usage.threshold_reached
	period     string // period.closed, usage.threshold_reached
	threshold  int64  // usage.threshold_reached
	grantID    string // credit.grant_expired (with customerID)
	topUp      int64  // top_up.* and credit.balance_low notices: the top-up's id
	balance    int64  // credit.balance_low: the balance that crossed the threshold
}

// recordNotice remembers n in tx, for the notifications written before tx
// commits (notifyTx). A transaction's first notice queues the read of the
// webhook endpoints, which then goes with the transaction's next statement
// instead of a round trip of its own before the commit.
func recordNotice(tx *Tx, n notice) {
	if slices.Contains(tx.notices, n) {
		return
	}
	tx.notices = append(tx.notices, n)
	if tx.parent == nil && tx.subs == nil {
		// Not in a savepoint, which may be rolled back with its queue: a
		// notice recorded in one is recorded here when the savepoint is
		// released (Commit hands it to its parent).
		tx.subs = queryLater(tx, collectSubscriptions, webhookSubscriptionsSQL)
	}
}

// notifyTx writes, in tx, a notification for each notice recorded in it
// that an endpoint subscribes to, one delivery per such endpoint and each
// delivery's job: a notification exists if and only if the change it
// reports committed.
func (l *Ledger) notifyTx(ctx context.Context, tx *Tx, now time.Time) error {
	if len(tx.notices) == 0 {
		return nil
	}
	endpoints, err := tx.subs.get(ctx)
	if err != nil {
		return err
	}
	if len(endpoints) == 0 {
		return nil
	}
	for _, n := range tx.notices {
		var to []subscription
		for _, e := range endpoints {
			if slices.Contains(e.events, n.typ) || slices.Contains(e.events, NotifyAll) {
				to = append(to, e)
			}
		}
		if len(to) == 0 {
			continue
		}
		object, customerID, err := noticeObjectTx(ctx, tx, now, n)
		if err != nil {
			return err
		}
		if err := l.notificationInsertTx(ctx, tx, now, n.typ, customerID, object, to); err != nil {
			return err
		}
	}
	return nil
}

type subscription struct {
	id       int64
	events   []string
	disabled bool // for failing: its deliveries are written failed, unsent, for a redelivery once it is enabled
}

// webhookSubscriptionsSQL reads the endpoints notifications go to.
const webhookSubscriptionsSQL = `SELECT id, events, disabled_at IS NOT NULL FROM billing.webhook_endpoints WHERE deleted_at IS NULL`

func collectSubscriptions(rows pgx.Rows) ([]subscription, error) {
	subs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (subscription, error) {
		var s subscription
		err := row.Scan(&s.id, &s.events, &s.disabled)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("error reading webhook endpoints: %w", err)
	}
	return subs, nil
}

// noticeObjectTx reads the object n reports, as the public API shows it,
// and the customer it belongs to.
func noticeObjectTx(ctx context.Context, tx *Tx, now time.Time, n notice) (any, string, error) {
	if n.chargeID != 0 {
		c, err := scanCharge(tx.QueryRow(ctx, `SELECT `+chargeColumns+` FROM billing.charges WHERE id = $1`, n.chargeID))
		if err != nil {
			return nil, "", fmt.Errorf("error reading charge %d to notify: %w", n.chargeID, err)
		}
		return c.Public(), c.CustomerID, nil
	}
	if n.threshold != 0 {
		th, err := usageThresholdTx(ctx, tx, n.customerID, n.period, n.threshold)
		return th, n.customerID, err
	}
	if n.topUp != 0 {
		t, err := scanTopUp(tx.QueryRow(ctx, `SELECT `+topUpColumns+` FROM billing.top_ups WHERE id = $1`, n.topUp))
		if err != nil {
			return nil, "", fmt.Errorf("error reading top-up %d to notify: %w", n.topUp, err)
		}
		if n.typ == NotifyCreditBalanceLow {
			b, err := balanceLowTx(ctx, tx, t, n.balance)
			return b, t.CustomerID, err
		}
		return t.Public(), t.CustomerID, nil
	}
	if n.grantID != "" {
		g, err := creditGrantGetTx(ctx, tx, now, n.customerID, n.grantID)
		if err != nil {
			return nil, "", fmt.Errorf("error reading grant %s/%s to notify: %w", n.customerID, n.grantID, err)
		}
		return g.Public(), n.customerID, nil
	}
	p, err := scanPeriod(tx.QueryRow(ctx, periodSelectSQL+`
WHERE p.customer_id = $1 AND p.period = $2`, n.customerID, n.period))
	if err != nil {
		return nil, "", fmt.Errorf("error reading period %s/%s to notify: %w", n.customerID, n.period, err)
	}
	return p.Public(), n.customerID, nil
}

// NotificationBody is what a webhook delivery posts: a notification.
type NotificationBody struct {
	// ID is stable across retries and redeliveries: a receiver drops
	// duplicates by it.
	ID         string    `json:"id"`
	Type       string    `json:"type"`
	CreatedAt  time.Time `json:"created_at"`
	APIVersion string    `json:"api_version"`
	Data       struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
}

func (l *Ledger) notificationInsertTx(ctx context.Context, tx *Tx, now time.Time, typ, customerID string, object any,
	endpoints []subscription) error {
	id, err := newNotificationID()
	if err != nil {
		return err
	}
	obj, err := json.Marshal(object)
	if err != nil {
		return fmt.Errorf("error encoding %s notification: %w", typ, err)
	}
	body := NotificationBody{ID: id, Type: typ, CreatedAt: now, APIVersion: NotificationAPIVersion}
	body.Data.Object = obj
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("error encoding %s notification: %w", typ, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO billing.notifications (id, customer_id, type, body, created_at) VALUES ($1, $2, $3, $4, $5)`,
		id, customerID, typ, raw, now); err != nil {
		return fmt.Errorf("error writing %s notification: %w", typ, err)
	}
	if l.config.Scheduler == nil {
		return errors.New("no scheduler to deliver webhooks with")
	}
	for _, e := range endpoints {
		status := DeliveryPending
		if e.disabled {
			status = DeliveryFailed
		}
		var deliveryID int64
		if err := tx.QueryRow(ctx, `
INSERT INTO billing.webhook_deliveries (notification_id, customer_id, endpoint_id, status, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $5) RETURNING id`, id, customerID, e.id, status, now).Scan(&deliveryID); err != nil {
			return fmt.Errorf("error writing delivery of %s to endpoint %d: %w", id, e.id, err)
		}
		if e.disabled {
			continue
		}
		if _, err := l.config.Scheduler.WebhookDeliveryJobInsertTx(ctx, tx, deliveryID); err != nil {
			return err
		}
	}
	return nil
}

func newNotificationID() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("error generating a notification id: %w", err)
	}
	return "ntf_" + hex.EncodeToString(b), nil
}
