package ledger

import "github.com/jackc/pgx/v5"

// planFresh, passed as a query's first argument, runs it as Postgres's
// unnamed statement: planned with its parameters for the tables as they are
// (never a generic plan cached earlier), in one round trip once pgx has
// cached its description, with binary parameters.
const planFresh = pgx.QueryExecModeCacheDescribe
