// Package sql holds Tally's goose migrations, embedded into the binaries so
// that cmd/migrate, the server's readiness check and the tests all apply the
// same files. Migrations create and change objects in the Postgres schema
// `billing` only; River's tables live in schema `river` and are migrated by
// River's own migrator (see internal/schema).
//
// Queries do not live here: each query sits next to the Go function that runs
// it, in internal/ledger.
package sql

import "embed"

// Migrations is the goose migration directory, rooted at "migrations".
//
//go:embed migrations/*.sql
var Migrations embed.FS
