package ledger_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/tally-billing/tally/internal/schema"
	"github.com/tally-billing/tally/internal/tools/testdb"
)

// Tally distributed by customer_id on Citus (docs/scaling.md, "Distributed
// by customer_id (Citus): a plan"): every customer-owned table is
// hash-distributed by customer_id and colocated with billing.customers, so
// each request and each transaction of the money path runs on one shard;
// the rest are reference tables (copied to every node) or stay on the
// coordinator. Citus holds a distributed table's constraints per shard,
// so it refuses a primary key, unique constraint or unique index (partial
// ones too) whose key columns do not include the distribution column, and
// a foreign key between distributed tables that does not pair it with the
// referenced table's. A reference or coordinator table may not reference a
// distributed one, and a distributed table may reference only reference
// tables. TestCitusShape holds the schema to that, and to the lists below:
// a new table fails it until it is in one of them.

// citusDistributed: the customer-owned tables, to be distributed by
// customer_id, and what each holds (and, for a table that reaches its
// customer through a parent, which: its customer_id is the parent's, and its
// foreign key to the parent pairs it).
var citusDistributed = map[string]string{
	"billing.customers":                "the customer itself: the distribution column is its key",
	"billing.periods":                  "a customer's billing periods",
	"billing.usage_events":             "the ledger: a customer's events",
	"billing.usage_event_voids":        "a customer's voided events",
	"billing.usage_rollups":            "a customer's usage per hour",
	"billing.usage_thresholds_reached": "a customer's thresholds reached per period",
	"billing.charges":                  "a customer's charges, one per period",
	"billing.charge_attempts":          "each Stripe call of a charge (charge_id)",
	"billing.charge_transitions":       "each status change of a charge (charge_id)",
	"billing.charge_lines":             "what a charge is made of (charge_id)",
	"billing.refunds":                  "the refunds of a charge (charge_id)",
	"billing.refund_events":            "each status of a refund (stripe_refund_id)",
	"billing.disputes":                 "the disputes of a charge (charge_id)",
	"billing.dispute_events":           "each status of a dispute (stripe_dispute_id)",
	"billing.statements":               "a settled charge's statement number (charge_id)",
	"billing.credit_grants":            "a customer's credit grants",
	"billing.credit_grant_entries":     "what happened to a customer's grant",
	"billing.top_ups":                  "a customer's top-ups",
	"billing.top_up_transitions":       "each status of a top-up (top_up)",
	"billing.notifications":            "the outbox: every notification is about one customer's charge, period, grant or top-up",
	"billing.webhook_deliveries":       "a notification's delivery to an endpoint (notification_id)",
	"billing.webhook_attempts":         "each try of a delivery (delivery_id)",
}

// citusPlacement is where a table would live on Citus.
type citusPlacement string

const (
	citusSharded     citusPlacement = "distributed" // hash-distributed by customer_id (citusDistributed)
	citusReference   citusPlacement = "reference"   // copied to every node: read where the shards are
	citusCoordinator citusPlacement = "coordinator" // a local table on the coordinator only
)

type citusOther struct {
	placement citusPlacement
	reason    string
}

// citusNotDistributed: the tables that are not distributed, each with why.
// River's schema is not listed: all of it stays on the coordinator.
var citusNotDistributed = map[string]citusOther{
	"billing.plans":                     {citusReference, "price books shared by customers; customers reference them"},
	"billing.plan_versions":             {citusReference, "versions of the shared price books; periods reference them"},
	"billing.plan_prices":               {citusReference, "prices of the shared versions; ingest and the close read them on the shard"},
	"billing.charge_status_transitions": {citusReference, "the fixed table of allowed status changes that the charges' trigger reads on each shard"},
	"billing.webhook_endpoints":         {citusReference, "the deployment's endpoints (at most 16), not a customer's; deliveries reference them"},
	"billing.api_keys":                  {citusReference, "the deployment's API keys, not a customer's"},
	"billing.stripe_events":             {citusCoordinator, "the Stripe webhook inbox, keyed by Stripe's event id: the customer is known only once the event is read"},
	"billing.operator_actions":          {citusCoordinator, "the operators' log, one order for all: the kill switch's pauses and resumes belong to no customer"},
	"billing.statement_counter":         {citusCoordinator, "one row: the deployment's last statement number, gap-free across customers"},
	"billing.usage_rollup_watermark":    {citusCoordinator, "one row: the roll-up job's watermark over every customer's events"},
	"billing.operations_snapshot":       {citusCoordinator, "one row: the metrics gauges' snapshot of the whole deployment"},
	"billing.goose_db_version":          {citusCoordinator, "goose's migration versions"},
}

// citusQuerier is what citusShapeViolations reads the catalog through: a
// pool, a connection or a transaction.
type citusQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// citusViolation is one way the schema breaks Citus's rules for the plan.
type citusViolation struct {
	Table      string // schema.table
	Constraint string // the constraint or index, "" for the table itself
	Problem    string // what is wrong and what to change
}

func (v citusViolation) String() string {
	if v.Constraint == "" {
		return v.Table + ": " + v.Problem
	}
	return v.Table + " " + v.Constraint + ": " + v.Problem
}

// citusShapeViolations reads the catalog of db's Tally schemas (every
// schema but Postgres's own and River's) and returns every way it breaks
// Citus's rules, with distributed and other the plan: which tables are
// distributed by customer_id and where the others live. River's tables are
// taken to stay on the coordinator.
func citusShapeViolations(ctx context.Context, db citusQuerier, distributed map[string]string,
	other map[string]citusOther) ([]citusViolation, error) {
	var out []citusViolation
	add := func(table, constraint, format string, args ...any) {
		out = append(out, citusViolation{Table: table, Constraint: constraint, Problem: fmt.Sprintf(format, args...)})
	}
	excluded := []string{schema.RiverSchema}
	placement := func(table string) citusPlacement {
		if _, ok := distributed[table]; ok {
			return citusSharded
		}
		if o, ok := other[table]; ok {
			return o.placement
		}
		if slices.Contains(excluded, strings.SplitN(table, ".", 2)[0]) {
			return citusCoordinator
		}
		return "" // unclassified: reported with the tables
	}

	// The tables (a partition goes with its parent), and their customer_id.
	rows, err := db.Query(ctx, `
SELECT format('%I.%I', n.nspname, c.relname), a.attnum IS NOT NULL, coalesce(a.attnotnull, false),
       coalesce(format_type(a.atttypid, a.atttypmod), '')
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'customer_id' AND NOT a.attisdropped
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname <> ALL ($1) AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\_%'
ORDER BY 1`, excluded)
	if err != nil {
		return nil, fmt.Errorf("error reading the tables: %w", err)
	}
	type tableInfo struct {
		name            string
		hasCustomer     bool
		customerNotNull bool
		customerType    string
	}
	tables, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (tableInfo, error) {
		var t tableInfo
		err := row.Scan(&t.name, &t.hasCustomer, &t.customerNotNull, &t.customerType)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("error reading the tables: %w", err)
	}
	exists := map[string]bool{}
	customersType := ""
	for _, t := range tables {
		exists[t.name] = true
		if t.name == "billing.customers" {
			customersType = t.customerType
		}
	}
	for _, t := range tables {
		if placement(t.name) == "" {
			add(t.name, "", "a new table, neither in citusDistributed nor in citusNotDistributed "+
				"(internal/ledger/citus_shape_test.go): list it as distributed by customer_id (a customer's rows), "+
				"or as a reference or coordinator table with the reason it is not a customer's")
			continue
		}
		if _, ok := distributed[t.name]; !ok {
			continue
		}
		switch {
		case !t.hasCustomer:
			add(t.name, "", "distributed by customer_id but has no customer_id column: add customer_id text NOT NULL, "+
				"filled from the row it belongs to, or list the table in citusNotDistributed with a reason")
		case !t.customerNotNull:
			add(t.name, "", "customer_id is nullable: Citus stores no row without its distribution column; make it NOT NULL")
		case customersType != "" && t.customerType != customersType:
			add(t.name, "", "customer_id is %s, billing.customers' is %s: colocated tables are distributed by "+
				"columns of one type", t.customerType, customersType)
		}
	}
	for _, list := range []map[string]bool{citusNames(distributed), citusNames(other)} {
		for name := range list {
			if !exists[name] {
				add(name, "", "listed in citus_shape_test.go but no such table: take it off the list")
			}
		}
	}

	// Primary keys, unique constraints and unique indexes (partial and
	// expression ones too), exclusion constraints: Citus holds each per
	// shard, so its key columns must include customer_id.
	rows, err = db.Query(ctx, `
SELECT format('%I.%I', n.nspname, c.relname), ic.relname,
       coalesce(con.contype::text, ''), coalesce(pg_get_constraintdef(con.oid), pg_get_indexdef(i.indexrelid)),
       EXISTS (SELECT 1 FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k (attnum, n)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
               WHERE k.n <= i.indnkeyatts AND a.attname = 'customer_id')
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_class ic ON ic.oid = i.indexrelid
LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid AND con.contype IN ('p', 'u', 'x')
WHERE (i.indisunique OR i.indisexclusion) AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname <> ALL ($1) AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\_%'
ORDER BY 1, 2`, excluded)
	if err != nil {
		return nil, fmt.Errorf("error reading the unique indexes: %w", err)
	}
	var table, name, kind, def string
	var hasCustomer bool
	_, err = pgx.ForEachRow(rows, []any{&table, &name, &kind, &def, &hasCustomer}, func() error {
		if _, ok := distributed[table]; !ok || hasCustomer {
			return nil
		}
		what := map[string]string{"p": "the primary key", "u": "the unique constraint", "x": "the exclusion constraint",
			"": "the unique index"}[kind]
		add(table, name, "%s %s does not include customer_id: Citus holds it per shard only; make customer_id one of "+
			"its key columns (a value that must be unique across customers needs another guard)", what, def)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error reading the unique indexes: %w", err)
	}

	// Foreign keys (a partition's clones go with their parent's).
	rows, err = db.Query(ctx, `
SELECT format('%I.%I', n.nspname, c.relname), con.conname, format('%I.%I', fn.nspname, fc.relname),
       pg_get_constraintdef(con.oid),
       EXISTS (SELECT 1 FROM unnest(con.conkey, con.confkey) AS k (attnum, fattnum)
               JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
               JOIN pg_attribute f ON f.attrelid = con.confrelid AND f.attnum = k.fattnum
               WHERE a.attname = 'customer_id' AND f.attname = 'customer_id')
FROM pg_constraint con
JOIN pg_class c ON c.oid = con.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_class fc ON fc.oid = con.confrelid
JOIN pg_namespace fn ON fn.oid = fc.relnamespace
WHERE con.contype = 'f' AND con.conparentid = 0
  AND n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\_%'
ORDER BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("error reading the foreign keys: %w", err)
	}
	var referenced string
	var paired bool
	_, err = pgx.ForEachRow(rows, []any{&table, &name, &referenced, &def, &paired}, func() error {
		from, to := placement(table), placement(referenced)
		switch {
		case from == "" || to == "":
			// An unclassified table is reported above.
		case from == citusSharded && to == citusSharded && !paired:
			add(table, name, "%s references distributed %s without customer_id on both sides: Citus checks a foreign "+
				"key within a shard; make it FOREIGN KEY (customer_id, …) REFERENCES %s (customer_id, …), which needs a "+
				"unique key on (customer_id, …) there", def, referenced, referenced)
		case from == citusSharded && to == citusCoordinator:
			add(table, name, "%s references %s, which stays on the coordinator: a distributed table may reference "+
				"only reference tables; make %s a reference table or drop the foreign key", def, referenced, referenced)
		case from != citusSharded && to == citusSharded:
			add(table, name, "%s: this %s table references distributed %s, which Citus refuses; distribute %s by "+
				"customer_id or drop the foreign key", def, from, referenced, table)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("error reading the foreign keys: %w", err)
	}

	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Table != out[j].Table {
			return out[i].Table < out[j].Table
		}
		return out[i].Constraint < out[j].Constraint
	})
	return out, nil
}

// citusNames is the set of m's keys.
func citusNames[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// The schema keeps Citus's rules for the plan (citusShapeViolations and the
// lists above): each violation fails, with what to change.
func TestCitusShape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testdb.New(t)

	for name := range citusDistributed {
		_, ok := citusNotDistributed[name]
		require.False(t, ok, "%s is in both lists", name)
	}
	violations, err := citusShapeViolations(ctx, pool, citusDistributed, citusNotDistributed)
	require.NoError(t, err)
	if len(violations) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "%d ways the schema breaks Citus's rules for tables distributed by customer_id "+
			"(docs/scaling.md, \"Distributed by customer_id (Citus): a plan\"):\n", len(violations))
		for _, v := range violations {
			fmt.Fprintf(&b, "  %s\n", v)
		}
		t.Error(b.String())
	}
}

// citusShapeViolations finds each kind of violation: tables and
// constraints made for it, in a transaction that rolls back, are reported,
// and those that keep the rules are not.
func TestCitusShapeViolations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testdb.New(t)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `
-- Keeps every rule: its key and unique indexes include customer_id, its
-- foreign keys pair customer_id, or go to a reference table.
CREATE TABLE billing.citus_probe_good (
    customer_id text    NOT NULL,
    id          bigint  NOT NULL,
    period      text    NOT NULL,
    plan_id     text,
    currency    text,
    PRIMARY KEY (customer_id, id),
    FOREIGN KEY (customer_id, period) REFERENCES billing.periods (customer_id, period),
    FOREIGN KEY (plan_id, currency) REFERENCES billing.plans (plan_id, currency)
);
CREATE UNIQUE INDEX citus_probe_good_partial ON billing.citus_probe_good (customer_id, period) WHERE id > 0;
CREATE UNIQUE INDEX citus_probe_good_include ON billing.citus_probe_good (id, customer_id) INCLUDE (period);
-- A partition goes with its parent, unlisted, and so do its keys'
-- and foreign keys' clones.
CREATE TABLE billing.citus_probe_parted (
    customer_id text   NOT NULL,
    id          bigint NOT NULL,
    period      text   NOT NULL,
    PRIMARY KEY (customer_id, id),
    FOREIGN KEY (customer_id, period) REFERENCES billing.periods (customer_id, period)
) PARTITION BY HASH (customer_id);
CREATE TABLE billing.citus_probe_parted_0 PARTITION OF billing.citus_probe_parted
    FOR VALUES WITH (MODULUS 1, REMAINDER 0);

-- Breaks each rule once.
CREATE TABLE billing.citus_probe_bad (
    id          bigint  PRIMARY KEY,
    customer_id text    NOT NULL,
    stripe_id   text    UNIQUE,
    charge_id   bigint  REFERENCES billing.citus_probe_bad (id),
    period      text,
    other       text,
    FOREIGN KEY (other, period) REFERENCES billing.periods (customer_id, period),
    FOREIGN KEY (customer_id, period) REFERENCES billing.periods (customer_id, period),
    EXCLUDE USING btree (other WITH =)
);
CREATE UNIQUE INDEX citus_probe_bad_partial ON billing.citus_probe_bad (period) WHERE id > 0;
CREATE UNIQUE INDEX citus_probe_bad_include ON billing.citus_probe_bad (id) INCLUDE (customer_id);
CREATE UNIQUE INDEX citus_probe_bad_expression ON billing.citus_probe_bad (lower(customer_id), id);
CREATE TABLE billing.citus_probe_no_customer (id bigint PRIMARY KEY);
CREATE TABLE billing.citus_probe_nullable (customer_id text, id bigint, UNIQUE (id, customer_id));
CREATE TABLE billing.citus_probe_varchar (customer_id varchar(255) NOT NULL PRIMARY KEY);
CREATE TABLE billing.citus_probe_reference (
    code      text PRIMARY KEY,
    charge_id bigint REFERENCES billing.citus_probe_bad (id)
);
CREATE TABLE billing.citus_probe_to_coordinator (
    customer_id text NOT NULL PRIMARY KEY,
    action_id   bigint REFERENCES billing.operator_actions (id)
);
CREATE TABLE billing.citus_probe_unlisted (id bigint PRIMARY KEY)`)
	require.NoError(t, err)

	distributed := map[string]string{}
	for k, v := range citusDistributed {
		distributed[k] = v
	}
	for _, name := range []string{"good", "parted", "bad", "no_customer", "nullable", "varchar", "to_coordinator", "gone"} {
		distributed["billing.citus_probe_"+name] = "a probe"
	}
	other := map[string]citusOther{}
	for k, v := range citusNotDistributed {
		other[k] = v
	}
	other["billing.citus_probe_reference"] = citusOther{citusReference, "a probe"}

	violations, err := citusShapeViolations(ctx, tx, distributed, other)
	require.NoError(t, err)
	var got, report []string
	for _, v := range violations {
		if strings.HasPrefix(v.Table, "billing.citus_probe_") {
			got = append(got, v.Table+" "+v.Constraint)
			report = append(report, v.String())
		}
	}
	require.Equal(t, []string{
		"billing.citus_probe_bad citus_probe_bad_charge_id_fkey",                       // to a distributed table, no customer_id
		"billing.citus_probe_bad citus_probe_bad_expression",                           // lower(customer_id) is not customer_id
		"billing.citus_probe_bad citus_probe_bad_include",                              // customer_id only INCLUDEd
		"billing.citus_probe_bad citus_probe_bad_other_excl",                           // an exclusion constraint
		"billing.citus_probe_bad citus_probe_bad_other_period_fkey",                    // customer_id paired with another column
		"billing.citus_probe_bad citus_probe_bad_partial",                              // a partial unique index
		"billing.citus_probe_bad citus_probe_bad_pkey",                                 // the primary key
		"billing.citus_probe_bad citus_probe_bad_stripe_id_key",                        // a unique constraint
		"billing.citus_probe_gone ",                                                    // listed, no such table
		"billing.citus_probe_no_customer ",                                             // distributed, no customer_id
		"billing.citus_probe_no_customer citus_probe_no_customer_pkey",                 // and so its key neither
		"billing.citus_probe_nullable ",                                                // customer_id nullable
		"billing.citus_probe_reference citus_probe_reference_charge_id_fkey",           // reference → distributed
		"billing.citus_probe_to_coordinator citus_probe_to_coordinator_action_id_fkey", // distributed → coordinator
		"billing.citus_probe_unlisted ",                                                // in neither list
		"billing.citus_probe_varchar ",                                                 // customer_id of another type
	}, got, "violations of the probes:\n%s", strings.Join(report, "\n"))
}
