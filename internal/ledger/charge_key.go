package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// ChargeKey is the stable identity of the charge of (customerID, period) in
// deployment namespace (Config.Namespace), sent to Stripe as
// metadata.tally_charge_key: hex(sha256("tally:charge:v2:" + namespace + ":" +
// customer + ":" + period)). An empty namespace gives the v1 key of the
// charges created before namespaces ("tally:charge:v1:" + customer + ":" +
// period), which they keep.
func ChargeKey(namespace, customerID, period string) string {
	return chargeKeyHash(namespace, customerID+":"+period)
}

// ChargeIdempotencyKey is the Stripe idempotency key of generation gen of
// the charge of (customerID, period) in namespace (v1 when empty).
func ChargeIdempotencyKey(namespace, customerID, period string, gen int) string {
	return chargeKeyHash(namespace, customerID+":"+period+":"+strconv.Itoa(gen))
}

func chargeKeyHash(namespace, rest string) string {
	prefix := "tally:charge:v1:"
	if namespace != "" {
		prefix = "tally:charge:v2:" + namespace + ":"
	}
	sum := sha256.Sum256([]byte(prefix + rest))
	return hex.EncodeToString(sum[:])
}

// IdempotencyKeyFor is the charge's Stripe idempotency key of generation gen,
// derived the way its keys were (its KeyNamespace).
func (c *Charge) IdempotencyKeyFor(gen int) string {
	return ChargeIdempotencyKey(c.KeyNamespace, c.CustomerID, c.Period, gen)
}
