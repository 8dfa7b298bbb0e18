package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Connect opens a connection pool to databaseURL configured the way every
// Tally process uses it: timestamps scan as UTC, and each connection names
// its application so operators can tell Tally's sessions apart in
// pg_stat_activity, and every statement is planned for the tables as they
// are when it runs (plan_cache_mode=force_custom_plan). maxConns of zero
// keeps pgx's default.
//
// Why custom plans: pgx prepares each statement once per connection, and
// after five runs Postgres may switch it to a generic plan that it keeps for
// the life of the connection. A generic plan chosen while a table was nearly
// empty (a new database, or no ANALYZE yet: autovacuum may be off or behind)
// can scan the whole table for ever after; River's scheduling query did, and
// took seconds per run once a thousand charge jobs were due. A custom plan
// costs a few tens of microseconds of planning per statement and always
// sees the table's current size.
func Connect(ctx context.Context, databaseURL, applicationName string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("error parsing database URL: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	if applicationName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = applicationName
	}
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		conn.TypeMap().RegisterType(&pgtype.Type{
			Name: "timestamptz", OID: pgtype.TimestamptzOID,
			Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC},
		})
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("error connecting to database: %w", err)
	}
	return pool, nil
}
