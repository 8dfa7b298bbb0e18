package chaos

import (
	"io"
	"time"
)

// Config sizes and paces a run. ShortConfig and LongConfig are the two
// variants; a zero field is an error.
type Config struct {
	Seed       int64
	Customers  int
	Events     int           // distinct events (duplicates and conflicts come on top)
	LoadFor    time.Duration // how long the load phase is spread over, roughly
	KillEvery  time.Duration // one SIGKILL of a random replica per interval
	QuiesceMax time.Duration // bound on the wait for every charge and job to settle
	Producers  int           // concurrent HTTP clients

	// RepoDir is the module root (binaries are built from it); WorkDir holds
	// the binaries, the Postgres cluster and every process's log.
	RepoDir string
	WorkDir string

	// PgBouncer runs the replicas' API and worker pools through a
	// PgBouncer in transaction mode in front of the run's cluster
	// (TALLY_POOLER_URL); River's pools, migrate and billingctl stay
	// direct. Postgres restarts then go on behind the pooler.
	PgBouncer bool

	// HA runs against the pg_auto_failover formation of scripts/ha.sh (a
	// primary and a synchronous secondary, reached by a multi-host URL)
	// instead of a private cluster: the Postgres fault becomes the
	// primary killed, twice, and a planned switchover.
	HA bool

	// Out receives progress lines and the report.
	Out io.Writer
}

// ShortConfig is the variant inside make test: a tenth of the long run's
// events, done in well under two minutes.
func ShortConfig(seed int64) Config {
	return Config{
		Seed: seed, Customers: 120, Events: 3_000, LoadFor: 15 * time.Second, KillEvery: 3 * time.Second,
		QuiesceMax: 90 * time.Second, Producers: 12,
	}
}

// LongConfig is make chaos: 500 customers × 3 periods, 50,000 events.
func LongConfig(seed int64) Config {
	return Config{
		Seed: seed, Customers: 500, Events: 50_000, LoadFor: 120 * time.Second, KillEvery: 4 * time.Second,
		QuiesceMax: 4 * time.Minute, Producers: 24,
	}
}

// Timings given to every replica: short enough that leases, retries and the
// key window turn over many times within a run.
const (
	stripeTimeout     = 2 * time.Second
	stripeLatency     = 3 * time.Second // injected latency, past the timeout
	keyWindow         = 20 * time.Second
	reconcileInterval = 3 * time.Second
	reconcileAfter    = 5 * time.Second
	retryMaxDelay     = 2 * time.Second
	closeGrace        = 4 * time.Hour // the run's three hourly periods stay open until closed explicitly
	webhookSecret     = "whsec_chaos"

	// dunningSchedule retries a declined charge 3 s and 6 s after its first
	// decline; dunningRetries is how many retries that is.
	dunningSchedule = "3s,6s"
	dunningRetries  = 2
	dunningInterval = time.Second

	// sweepInterval is TALLY_SWEEP_INTERVAL: short, so grants that expire
	// during the run are written off within it.
	sweepInterval = 3 * time.Second

	// periodBudget is TALLY_PERIOD_BUDGET_CENTS: set, so every charge
	// reserves and releases under the faults, but above any period's spend,
	// so it holds none (the check compares the spend with the charges).
	periodBudget = 1_000_000_000_000

	// pauseGrace is how long after the kill switch a call already past its
	// claim may still create a PaymentIntent (a look-up and a create, each
	// up to the Stripe timeout, plus the injected latency); pauseCheck how
	// long after that no new one may appear.
	pauseGrace = 2*stripeTimeout + stripeLatency + time.Second
	pauseCheck = 4 * time.Second

	// resumeTimeout bounds the retries of the drill's resume (Postgres may be
	// restarting meanwhile).
	resumeTimeout = time.Minute
)
