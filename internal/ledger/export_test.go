package ledger

// UsageEventInsertOpenSQL is the single-event statement, for plan tests.
const UsageEventInsertOpenSQL = usageEventInsertOpenSQL
