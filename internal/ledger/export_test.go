package ledger

// Statements whose plans tests hold to an index.
const (
	UsageEventInsertOpenSQL = usageEventInsertOpenSQL
	ChargeHistorySQL        = chargeHistorySQL
)
