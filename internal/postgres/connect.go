// Package postgres opens Tally's connection pools, configured the same way in
// every process (cmd/server, cmd/billingctl, cmd/migrate, the tests).
package postgres

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
// pg_stat_activity. maxConns of zero keeps pgx's default.
//
// Statements keep Postgres's default plan caching: pgx prepares each one per
// connection and after five runs Postgres may keep a generic plan for it.
// Tally's own statements are written so that any plan is an index lookup
// (one row by key, found by the key alone); those whose best plan depends
// on sizes (the batch joins over unnest) are passed ledger's planFresh, and are
// planned for the tables as they are each time they run.
func Connect(ctx context.Context, databaseURL, applicationName string, maxConns int32) (*pgxpool.Pool, error) {
	return connect(ctx, databaseURL, applicationName, maxConns, modeDirect)
}

// ConnectPooled opens a pool as Connect does, through a connection pooler in
// transaction mode (PgBouncer) at poolerURL, which hands each transaction —
// or each statement outside one — to whichever server connection is free. A
// named prepared statement lives on one server connection, so the pool
// prepares none: every statement runs as Postgres's unnamed statement, parsed
// and bound in the round trip that runs it, its description cached by pgx
// (pgx.QueryExecModeCacheDescribe; the description is the statement's, not
// the connection's, so it holds on any of them). Postgres then plans each
// run afresh, as it does for the statements passed ledger's planFresh.
func ConnectPooled(ctx context.Context, poolerURL, applicationName string, maxConns int32) (*pgxpool.Pool, error) {
	return connect(ctx, poolerURL, applicationName, maxConns, modePooled)
}

// ConnectQueue opens a pool as Connect does, for River's own queries, which
// are planned for the tables as they are each time they run
// (plan_cache_mode=force_custom_plan). River's scheduling query, given a
// generic plan while river_job was nearly empty (a new database; no ANALYZE
// yet, autovacuum off or behind), scanned the table for each due job, a cost
// that grows with the square of the jobs due. River runs a few statements
// per batch of jobs, so the planning costs little there; Tally's per-event
// statement runs once per event, where planning each run would be a large
// share of ingest (docs/benchmarks.md, "Figures behind the code's
// choices").
func ConnectQueue(ctx context.Context, databaseURL, applicationName string, maxConns int32) (*pgxpool.Pool, error) {
	return connect(ctx, databaseURL, applicationName, maxConns, modeQueue)
}

// connectMode is how a pool's statements are prepared and planned.
type connectMode int

const (
	modeDirect connectMode = iota // named prepared statements, Postgres's default plan caching
	modeQueue                     // named prepared statements, each run planned afresh (plan_cache_mode)
	modePooled                    // no named prepared statement: through a pooler in transaction mode
)

func connect(ctx context.Context, databaseURL, applicationName string, maxConns int32, mode connectMode) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("error parsing database URL: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	switch mode {
	case modeQueue:
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	case modePooled:
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
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
