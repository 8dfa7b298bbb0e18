package chaos

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-billing/tally/internal/stripesim"
	"github.com/tally-billing/tally/internal/tools/pgbouncer"
	"github.com/tally-billing/tally/internal/tools/proc"
)

// run is the state of one chaos run.
type run struct {
	cfg      Config
	rnd      *rand.Rand
	rndMu    sync.Mutex
	cluster  database           // a private cluster, or the HA formation (Config.HA)
	bouncer  *pgbouncer.Bouncer // with Config.PgBouncer
	dbURL    string
	binDir   string
	stack    *stack
	sim      *proc.Proc
	control  *stripesim.ControlClient
	apis     []*proc.Proc
	workers  []*proc.Proc
	apiURLs  []string
	producer *producer

	faultsMu sync.Mutex
	faults   map[string]int
	outages  []string // each database fault as the producers saw it (Config.HA)
	// outagesWG waits for the outages' measures of charges in flight.
	outagesWG sync.WaitGroup

	// pauseLeaks counts PaymentIntents created while charging was paused,
	// after the grace for calls already past their claim: a violation.
	pauseLeaks int

	// plans is every plan version the run put, as the API numbered it.
	plans   planBook
	plansMu sync.Mutex

	workTotal int
	workDone  atomic.Int64 // units of work posted so far

	// topUps is what the run asked of the top-ups API and was answered;
	// rechargers are the customers with an automatic recharge.
	topUps     *topUpBook
	rechargers []int
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Out, "chaos %s: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (r *run) intn(n int) int {
	r.rndMu.Lock()
	defer r.rndMu.Unlock()
	return r.rnd.IntN(n)
}

func (r *run) fault(name string) {
	r.faultsMu.Lock()
	defer r.faultsMu.Unlock()
	r.faults[name]++
}

// Run performs one chaos run and returns its report. An error means the run
// itself could not be carried out; violations of the promise are in the
// report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	start := time.Now()
	r := &run{cfg: cfg, rnd: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x7a11)), faults: map[string]int{}, plans: planBook{},
		topUps: newTopUpBook()}
	r.logf("seed %d: %d customers, %d events, load over %s", cfg.Seed, cfg.Customers, cfg.Events, cfg.LoadFor)

	var err error
	if r.binDir, err = proc.Commands(ctx, cfg.RepoDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.WorkDir, "logs"), 0o755); err != nil {
		return nil, err
	}
	if cfg.HA {
		r.logf("bringing up the pg_auto_failover formation (scripts/ha.sh)")
		if r.cluster, err = startFormation(ctx, cfg.RepoDir, false); err != nil {
			return nil, err
		}
	} else if r.cluster, err = startCluster(ctx, cfg.WorkDir); err != nil {
		return nil, err
	}
	defer r.cluster.stop()
	if err := r.startStack(ctx); err != nil {
		return nil, err
	}
	defer r.stopStack()

	report, err := r.exercise(ctx)
	if err != nil {
		return nil, err
	}
	report.Seed, report.Duration, report.Customers, report.EventsPlanned = cfg.Seed, time.Since(start), cfg.Customers, cfg.Events
	return report, nil
}

// startStack creates the database, migrates it, and starts the simulator,
// two API replicas and three worker replicas.
func (r *run) startStack(ctx context.Context) error {
	admin, err := pgx.Connect(ctx, r.cluster.adminURL())
	if err != nil {
		return err
	}
	var exists bool // the formation comes with an empty one (scripts/ha.sh up)
	if err = admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = 'tally')`).Scan(&exists); err == nil && !exists {
		_, err = admin.Exec(ctx, "CREATE DATABASE tally")
	}
	admin.Close(ctx)
	if err != nil {
		return err
	}
	r.dbURL = r.cluster.url("tally")
	env := []string{fmt.Sprintf("TALLY_PERIOD_BUDGET_CENTS=%d", periodBudget)}
	if _, ok := r.cluster.(*formation); ok {
		// The formation's nodes keep Postgres's 100 connections: 2 API
		// replicas × 8 and 3 worker replicas × (10 + River's 8) fit, with
		// room for replication, the monitor and the run's own.
		env = append(env, "TALLY_API_DB_MAX_CONNS=8", "TALLY_WORKER_DB_MAX_CONNS=10")
	}
	if r.cfg.PgBouncer {
		// Fewer server connections than the replicas' pools hold, so that a
		// client's consecutive transactions land on different ones.
		b, err := pgbouncer.Start(ctx, pgbouncer.Config{Dir: filepath.Join(r.cfg.WorkDir, "pgbouncer"), Backend: r.dbURL, PoolSize: 12})
		if err != nil {
			return err
		}
		r.bouncer = b
		poolerURL, err := b.URL(r.dbURL)
		if err != nil {
			return err
		}
		env = append(env, "TALLY_POOLER_URL="+poolerURL)
		r.logf("pools through pgbouncer (transaction mode, 12 server connections) on 127.0.0.1:%d", b.Port)
	}
	st, err := newStack(ctx, stackConfig{binDir: r.binDir, logDir: filepath.Join(r.cfg.WorkDir, "logs"),
		dbURL: r.dbURL, apis: 2, workers: 3, env: env})
	if err != nil {
		if r.bouncer != nil {
			r.bouncer.Stop()
		}
		return err
	}
	r.stack, r.sim, r.control, r.apis, r.workers, r.apiURLs = st, st.sim, st.control, st.apis, st.workers, st.apiURLs
	r.producer = st.newProducer()
	if r.cfg.HA {
		// A failover takes the monitor's timeouts (about 50 s here): the
		// producers retry for longer, as the README tells producers to.
		r.producer.retryFor = 3 * time.Minute
	}
	r.producer.voidEvery = chaosVoidEvery
	r.logf("stack up: api %v, simulator %s, database %s", r.apiURLs, r.control.BaseURL, r.dbURL)
	return nil
}

func (r *run) all() []*proc.Proc { return r.stack.all() }

func (r *run) stopStack() {
	r.stack.stop()
	if r.bouncer != nil {
		r.bouncer.Stop()
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// exercise runs the load with faults, waits for quiescence and checks.
func (r *run) exercise(ctx context.Context) (*Report, error) {
	if err := r.putPlan(ctx, chaosPlanVersions[0]); err != nil {
		return nil, err
	}
	customers := make([]string, r.cfg.Customers)
	expect := map[string]expectation{}
	var buyers []int
	prepaidRank := 0
	for i := range customers {
		customers[i] = fmt.Sprintf("c-%04d", i)
		stripeID := stripeCustomerID(i)
		role := roleGrantsOnly
		if prepaidCustomer(i) {
			role = prepaidRoleOf(r.cfg.Seed, prepaidRank, i)
			prepaidRank++
		}
		switch role {
		case roleTopUps:
			buyers = append(buyers, i)
		case roleRecharge:
			r.rechargers = append(r.rechargers, i)
		}
		ans, err := r.producer.do(ctx, http.MethodPut, "/v1/customers/"+customers[i], i%2, customerBody(i, role == roleRecharge))
		if err != nil {
			return nil, err
		}
		if ans.status/100 != 2 {
			return nil, fmt.Errorf("PUT /v1/customers/%s answered %d %s", customers[i], ans.status, ans.code)
		}
		if prepaidCustomer(i) {
			if err := r.grantCredits(ctx, i, customers[i]); err != nil {
				return nil, err
			}
		}
		switch {
		case i%40 == 7:
			expect[customers[i]] = expectation{failureCode: "card_declined"}
			if err := r.control.FaultAdd(ctx, stripesim.Fault{Customer: stripeID, Kind: stripesim.FaultKindDecline, DeclineCode: "insufficient_funds"}); err != nil {
				return nil, err
			}
			r.fault("decline customer")
		case i%40 == 19 || i%40 == 31:
			// Declines once (or twice), then pays: dunning retries it.
			n := 1 + i%40/31
			expect[customers[i]] = expectation{declines: n}
			if err := r.control.FaultAdd(ctx, stripesim.Fault{Customer: stripeID, Kind: stripesim.FaultKindDecline, DeclineCode: "expired_card", Count: n}); err != nil {
				return nil, err
			}
			r.fault(fmt.Sprintf("customer declining %d times, then paying", n))
		case i%80 == 13:
			expect[customers[i]] = expectation{failureCode: "requires_action"}
			if err := r.control.FaultAdd(ctx, stripesim.Fault{Customer: stripeID, Kind: stripesim.FaultKindRequiresAction}); err != nil {
				return nil, err
			}
			r.fault("requires_action customer")
		}
	}
	rcv, err := startReceiver(ctx, r.cfg.Seed, r.binDir, r.dbURL)
	if err != nil {
		return nil, err
	}
	defer rcv.close()
	r.fault("webhook receiver failing 30% of deliveries")
	if _, err := r.control.WebhookModeSet(ctx, r.webhookMode()); err != nil {
		return nil, err
	}
	r.fault("webhook duplicate+delay+reorder mode")

	h0 := time.Now().UTC().Truncate(time.Hour)
	periods := []time.Time{h0.Add(-2 * time.Hour), h0.Add(-time.Hour), h0}
	work, _ := planLoad(r.rnd, customers, periods, r.cfg.Events)
	r.workTotal = len(work)
	// The top-ups have their own stream of the seed, so the load is the one
	// the seed gave before there were top-ups.
	topUps := planTopUps(rand.New(rand.NewPCG(uint64(r.cfg.Seed), 0x7095)), buyers, customers)
	for _, t := range topUps {
		r.topUps.planned[t.id+"/"+t.topUpID] = t
	}
	r.logf("posting %d units of work with %d producers; %d top-ups for %d customers, %d customers with an automatic recharge",
		len(work), r.cfg.Producers, len(topUps), len(buyers), len(r.rechargers))

	loadCtx, stopFaults := context.WithCancel(ctx)
	var faultsWG sync.WaitGroup
	for _, loop := range []func(context.Context){r.killLoop, r.stripeFaultLoop, r.pgTerminateLoop, r.keyExpireLoop} {
		faultsWG.Add(1)
		go func() { defer faultsWG.Done(); loop(loadCtx) }()
	}
	faultsWG.Add(1)
	go func() { defer faultsWG.Done(); r.milestones(loadCtx, customers, periods) }()
	topUpsDone := make(chan struct{})
	go func() { defer close(topUpsDone); r.topUpLoop(ctx, topUps) }()

	r.produce(ctx, work)
	r.logf("load done: %d posts, %d acknowledged", r.producer.stats.posts.Load(), len(r.producer.stats.acked))
	stopFaults()
	faultsWG.Wait()
	<-topUpsDone
	r.webhooksUp(ctx) // when the load ended inside the outage

	// Quiescence: every replica up, the last periods closed, discarded jobs
	// redriven (twice), then wait for every charge and job to settle.
	for _, p := range r.all() {
		if !p.Running() {
			if err := p.Start(); err != nil {
				return nil, err
			}
		}
	}
	for _, p := range r.all() {
		if err := p.WaitReady(ctx, 60*time.Second); err != nil {
			return nil, err
		}
	}
	// The last period's closes apply the grants top-ups bought: they come
	// once no top-up is in flight (see waitTopUpsSettled).
	r.closeAll(ctx, customers, periods[:2])
	r.waitTopUpsSettled(ctx, r.cfg.QuiesceMax/2)
	r.closeAll(ctx, customers, periods[2:])
	for range 2 {
		out, err := proc.RunTool(ctx, filepath.Join(r.binDir, "billingctl"), []string{"DATABASE_URL=" + r.dbURL}, "redrive")
		if err != nil {
			return nil, err
		}
		r.logf("redrive: %s", lastLine(out))
		r.fault("redrive")
		time.Sleep(2 * time.Second)
	}
	quiet := r.waitQuiescent(ctx)

	conn, err := pgx.Connect(ctx, r.dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	pis, err := r.control.PaymentIntentList(ctx)
	if err != nil {
		return nil, err
	}
	stats := r.producer.stats
	stats.mu.Lock()
	acked, voided, voidLost := stats.acked, stats.voided, stats.voidLost
	stats.mu.Unlock()
	r.plansMu.Lock()
	plans := r.plans
	r.plansMu.Unlock()
	chargePIs, _ := splitPaymentIntents(pis)
	violations, byStatus, lines, err := check(ctx, conn, chargePIs, acked, expect, plans)
	if err != nil {
		return nil, err
	}
	voidViolations, voids, err := checkVoids(ctx, conn, voided, voidLost)
	if err != nil {
		return nil, err
	}
	violations = append(violations, voidViolations...)
	creditViolations, credits, err := checkCredits(ctx, conn)
	if err != nil {
		return nil, err
	}
	violations = append(violations, creditViolations...)
	notified, err := checkNotifications(ctx, conn, rcv)
	if err != nil {
		return nil, err
	}
	violations = append(violations, notified...)
	taken, _, tries, failed := rcv.snapshot()
	topUpViolations, topUpCounts, err := checkTopUps(ctx, conn, pis, r.topUps, taken)
	if err != nil {
		return nil, err
	}
	violations = append(violations, topUpViolations...)
	r.logf("webhook receiver: %d notifications taken in %d deliveries, %d answered 503 on purpose", len(taken), tries, failed)
	if r.pauseLeaks > 0 {
		violations = append(violations, fmt.Sprintf("%d PaymentIntents were created while charging was paused", r.pauseLeaks))
	}
	if quiet != nil {
		violations = append([]string{quiet.Error()}, violations...)
	}
	var inLedger int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM billing.usage_events`).Scan(&inLedger); err != nil {
		return nil, err
	}
	r.outagesWG.Wait()
	r.faultsMu.Lock()
	defer r.faultsMu.Unlock()
	return &Report{
		EventPosts: stats.posts.Load(), HTTPRequests: stats.sent.Load(), EventsAcked: len(acked),
		EventsInLedger: inLedger, VoidsAcked: len(voided), VoidsInLedger: voids, Rejected: stats.rejected, Responses: stats.responses, Faults: r.faults,
		Outages: r.outages,
		Charges: byStatus, PaymentIntents: len(pis), Lines: lines, Credits: credits, TopUps: topUpCounts, Violations: violations,
	}, nil
}

// produce posts the work with the configured producers, paced to spread it
// over LoadFor.
func (r *run) produce(ctx context.Context, work []post) {
	ch := make(chan post)
	var wg sync.WaitGroup
	pause := r.cfg.LoadFor * time.Duration(r.cfg.Producers) / time.Duration(max(len(work), 1))
	for range r.cfg.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w := range ch {
				r.producer.send(ctx, w)
				r.workDone.Add(1)
				time.Sleep(pause)
			}
		}()
	}
	for _, w := range work {
		select {
		case ch <- w:
		case <-ctx.Done():
		}
	}
	close(ch)
	wg.Wait()
}

// putPlan puts a version of chaosPlanID through the API and records it
// under the version number the API answered.
func (r *run) putPlan(ctx context.Context, def planDef) error {
	ans, err := r.producer.do(ctx, http.MethodPut, "/v1/plans/"+chaosPlanID, 0, def)
	if err != nil {
		return fmt.Errorf("error putting plan %s: %w", chaosPlanID, err)
	}
	if ans.status/100 != 2 || ans.version < 1 {
		return fmt.Errorf("PUT /v1/plans/%s answered %d %s (version %d)", chaosPlanID, ans.status, ans.code, ans.version)
	}
	r.plansMu.Lock()
	r.plans.add(chaosPlanID, ans.version, def)
	r.plansMu.Unlock()
	r.fault(fmt.Sprintf("plan version %d put", ans.version))
	return nil
}

// planVersion2At is the share of the work after which the plan's second
// version is put.
const planVersion2At = 0.25

// milestones stops the webhooks from webhookOutageFrom to webhookOutageTo
// (only top-ups call Stripe then), puts the plan's second version at
// planVersion2At, closes the oldest period once 45% of the work is posted
// (the recharges it starts meet a stored 500 first: rechargeFaults),
// pauses charging (the kill switch) at 47% while those charges (and the
// recharges those closes started) run, puts the recharge customers again
// with the same body at 50%, restarts Postgres at 55%, and closes the
// middle period at 80% — the points up to which planLoad placed most of
// each period's events.
func (r *run) milestones(ctx context.Context, customers []string, periods []time.Time) {
	steps := []struct {
		at float64
		do func()
	}{
		{webhookOutageFrom, func() { r.webhooksDown(ctx) }},
		{planVersion2At, func() {
			if err := r.putPlan(context.WithoutCancel(ctx), chaosPlanVersions[1]); err != nil {
				r.logf("%v", err)
			}
		}},
		{webhookOutageTo, func() { r.webhooksUp(ctx) }},
		{0.45, func() {
			r.rechargeFaults(ctx)
			r.closeAll(ctx, customers, periods[:1])
		}},
		{0.47, func() { r.killSwitch(ctx) }},
		{0.50, func() { r.rePutRecharge(context.WithoutCancel(ctx), r.rechargers, customers) }},
		{0.55, func() { r.restartPostgres() }},
		{0.80, func() { r.closeAll(ctx, customers, periods[1:2]) }},
	}
	if f, ok := r.cluster.(*formation); ok {
		// The formation's primary is killed at 55% (restartPostgres), again
		// at 65% once the old one rejoined, and handed over in a planned
		// switchover at 75%, while the load and the first period's charges
		// run.
		steps = append(steps[:len(steps)-1],
			struct {
				at float64
				do func()
			}{0.65, func() { r.restartPostgres() }},
			struct {
				at float64
				do func()
			}{0.75, func() {
				r.logf("switchover")
				inFlight := r.chargesInFlight()
				r.producer.stats.outageBegin()
				if err := f.switchover(context.Background()); err != nil {
					r.logf("switchover failed: %v", err)
					return
				}
				r.fault("switchover")
				r.outage("switchover", inFlight)
			}},
			steps[len(steps)-1])
	}
	for _, s := range steps {
		for float64(r.workDone.Load()) < s.at*float64(r.workTotal) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		s.do()
	}
}

// restartPostgres is the run's Postgres fault: the cluster restarted, or the
// formation's primary killed (a failover).
func (r *run) restartPostgres() {
	_, ha := r.cluster.(*formation)
	name := "postgres restart"
	if ha {
		name = "primary killed"
	}
	r.logf("%s", name)
	if !ha {
		if err := r.cluster.restart(context.Background(), func() {}); err != nil {
			r.logf("%s failed: %v", name, err)
			return
		}
		r.fault(name)
		return
	}
	inFlight := r.chargesInFlight()
	if err := r.cluster.restart(context.Background(), r.producer.stats.outageBegin); err != nil {
		r.logf("%s failed: %v", name, err)
		return
	}
	r.fault(name)
	r.outage(name, inFlight)
}

// chargesInFlight returns the charges being charged now (pending, unknown
// or processing), for an outage to follow; nil when the read fails.
func (r *run) chargesInFlight() []int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.dbURL)
	if err != nil {
		return nil
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT id FROM billing.charges WHERE status IN ('pending', 'unknown', 'processing')`)
	if err != nil {
		return nil
	}
	ids, _ := pgx.CollectRows(rows, pgx.RowTo[int64])
	return ids
}

// settled follows the charges ids, in flight at a fault at at, for up to
// three minutes and says when they settled (left pending, unknown and
// processing): the median and the last, and how many had not. Some of the
// run's Stripe faults keep a charge unsettled for longer on purpose.
func (r *run) settled(ids []int64, at time.Time) string {
	open := map[int64]bool{}
	for _, id := range ids {
		open[id] = true
	}
	var took []time.Duration
	var conn *pgx.Conn // one connection, made again after an error (a failover)
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for deadline := time.Now().Add(3 * time.Minute); len(open) > 0 && time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var err error
		if conn == nil {
			if conn, err = pgx.Connect(ctx, r.dbURL); err != nil {
				conn = nil
				cancel()
				continue
			}
		}
		rows, err := conn.Query(ctx, `SELECT id FROM billing.charges WHERE id = ANY($1) AND status NOT IN ('pending', 'unknown', 'processing')`,
			slices.Collect(maps.Keys(open)))
		var done []int64
		if err == nil {
			done, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		}
		cancel()
		if err != nil {
			conn.Close(context.Background())
			conn = nil
			continue
		}
		for _, id := range done {
			delete(open, id)
			took = append(took, time.Since(at))
		}
	}
	if len(took) == 0 {
		return fmt.Sprintf("; %d charges in flight at the fault, none settled within 3 min", len(ids))
	}
	slices.Sort(took)
	return fmt.Sprintf("; %d charges in flight at the fault: %d settled, the median %.1f s and the last %.1f s after it, %d not within 3 min",
		len(ids), len(took), took[len(took)/2].Seconds(), took[len(took)-1].Seconds(), len(open))
}

// outage ends the measure of the database fault name, begun with
// loadStats.outageBegin, once a request sent after the fault's end is
// acknowledged (a minute at most), and records it for the report; then,
// beside the next faults, it follows the charges inFlight at the fault.
func (r *run) outage(name string, inFlight []int64) {
	end := time.Now()
	for deadline := end.Add(time.Minute); !r.producer.stats.outageAcked(end) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	m, ok := r.producer.stats.outageEnd()
	line := fmt.Sprintf("%s: no acknowledged write; refused: %s", name, formatCounts(m.refused))
	if ok {
		line = fmt.Sprintf("%s: first acknowledged write %.1f s after it, longest time without one %.1f s; refused meanwhile: %s",
			name, m.firstAck.Seconds(), m.longest.Seconds(), formatCounts(m.refused))
	}
	r.faultsMu.Lock()
	i := len(r.outages)
	r.outages = append(r.outages, line)
	r.faultsMu.Unlock()
	r.logf("%s", line)
	if len(inFlight) == 0 {
		return
	}
	// The charges' wait runs beside the next faults; the report waits for
	// it (outagesWG).
	r.outagesWG.Add(1)
	go func() {
		defer r.outagesWG.Done()
		more := r.settled(inFlight, m.at)
		r.logf("%s%s", name, more)
		r.faultsMu.Lock()
		defer r.faultsMu.Unlock()
		r.outages[i] += more
	}()
}

// killSwitch pauses charging with billingctl, checks that the simulator
// records no new PaymentIntent once the calls already past their claim had
// time to finish (pauseGrace), and resumes. A PaymentIntent created after the
// grace is a violation, recorded in r.pauseLeaks. The resume outlives ctx
// (the load may end during the drill): a drill that paused always resumes, or
// the run's charges would wait for ever.
func (r *run) killSwitch(ctx context.Context) {
	ctl := func(ctx context.Context, args ...string) error {
		_, err := proc.RunTool(ctx, filepath.Join(r.binDir, "billingctl"), []string{"DATABASE_URL=" + r.dbURL}, args...)
		return err
	}
	if err := ctl(ctx, "charging", "pause", "--reason", "chaos: kill switch drill"); err != nil {
		r.logf("pause failed: %v", err)
		return
	}
	r.fault("charging paused")
	count := func() int {
		pis, err := r.control.PaymentIntentList(context.WithoutCancel(ctx))
		if err != nil {
			return -1
		}
		return len(pis)
	}
	time.Sleep(pauseGrace)
	before := count()
	time.Sleep(pauseCheck)
	after := count()
	r.logf("charging paused: %d PaymentIntents after %s, %d after %s more", before, pauseGrace, after, pauseCheck)
	if before >= 0 && after > before {
		r.pauseLeaks = after - before
	}
	resumeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resumeTimeout)
	defer cancel()
	for err := ctl(resumeCtx, "charging", "resume", "--reason", "chaos: drill over"); err != nil; err = ctl(resumeCtx, "charging", "resume", "--reason", "chaos: drill over") {
		r.logf("resume failed (retrying): %v", err)
		select {
		case <-resumeCtx.Done():
			r.logf("charging left paused: no resume in %s", resumeTimeout)
			return
		case <-time.After(time.Second):
		}
	}
	r.fault("charging resumed")
}

// closeAll closes the given periods of every customer through the admin API
// (404 for a customer without events in one is fine).
func (r *run) closeAll(ctx context.Context, customers []string, periods []time.Time) {
	for _, p := range periods {
		label := p.Format("2006-01-02T15")
		r.logf("closing period %s for every customer", label)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i, c := range customers {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				ans, err := r.producer.do(context.WithoutCancel(ctx), http.MethodPost, "/v1/customers/"+c+"/periods/"+label+"/close", i%2, map[string]any{})
				if err == nil && ans.status == http.StatusOK {
					r.fault("period closed")
				}
			}()
		}
		wg.Wait()
	}
}

// killLoop SIGKILLs a random replica every KillEvery, a worker and an API
// replica in turn, and restarts it after a pause, until 70% of the load: a
// job left running by a killed worker waits for River's rescuer
// (RescueStuckJobsAfter plus its interval), which then has time to run
// before the end.
func (r *run) killLoop(ctx context.Context) {
	groups := [][]*proc.Proc{r.workers, r.apis}
	stopAt := time.Now().Add(r.cfg.LoadFor * 7 / 10)
	for n := 0; time.Now().Before(stopAt); n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.KillEvery):
		}
		replicas := groups[n%len(groups)]
		p := replicas[r.intn(len(replicas))]
		if !p.Running() {
			continue
		}
		p.Kill()
		r.fault("kill")
		r.fault("kill " + strings.Split(p.Name, "-")[0])
		pause := time.Duration(500+r.intn(2000)) * time.Millisecond
		go func() {
			time.Sleep(pause)
			if err := p.Start(); err != nil {
				r.logf("restart of %s failed: %v", p.Name, err)
			}
		}()
	}
}

// stripeFaultLoop injects a Stripe fault every second or so, for every
// customer or for one, each good for a few requests.
func (r *run) stripeFaultLoop(ctx context.Context) {
	kinds := []struct {
		kind  stripesim.FaultKind
		count int
	}{
		{stripesim.FaultKindLatency, 4},
		{stripesim.FaultKindError500AfterCreate, 3},
		{stripesim.FaultKindError500BeforeCreate, 3},
		{stripesim.FaultKindDropAfterCreate, 3},
		{stripesim.FaultKindRateLimit, 15},
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(700+r.intn(800)) * time.Millisecond):
		}
		k := kinds[r.intn(len(kinds))]
		f := stripesim.Fault{Customer: stripesim.FaultCustomerAll, Kind: k.kind, Count: k.count}
		if k.kind == stripesim.FaultKindLatency {
			f.Latency = stripeLatency
		}
		if err := r.control.FaultAdd(context.WithoutCancel(ctx), f); err != nil {
			r.logf("fault %s: %v", k.kind, err)
			continue
		}
		r.fault("stripe " + string(k.kind))
	}
}

// pgTerminateLoop terminates a few of Tally's Postgres connections every few
// seconds.
func (r *run) pgTerminateLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(1500+r.intn(2000)) * time.Millisecond):
		}
		conn, err := pgx.Connect(ctx, r.cluster.adminURL())
		if err != nil {
			continue
		}
		var n int
		err = conn.QueryRow(ctx, `
SELECT count(pg_terminate_backend(pid)) FROM (
    SELECT pid FROM pg_stat_activity
    WHERE application_name LIKE 'tally-server%' AND pid <> pg_backend_pid()
    ORDER BY random() LIMIT $1) t`, 1+r.intn(3)).Scan(&n)
		conn.Close(context.Background())
		if err == nil {
			for range n {
				r.fault("pg_terminate_backend")
			}
		}
	}
}

// keyExpireLoop makes the simulator forget every idempotency key older than
// Tally's key window (plus the longest call): a clock jump past the key
// window for the charges Tally no longer trusts its key for, so their retries
// must reconcile, never reuse a forgotten key. Keys Tally still trusts are
// left alone, as Stripe keeps them 24 h.
func (r *run) keyExpireLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
		n, err := r.control.IdempotencyExpire(context.WithoutCancel(ctx), keyWindow+stripeLatency+2*time.Second)
		if err == nil && n > 0 {
			r.fault("stripe key expired past window")
			r.faultsMu.Lock()
			r.faults["stripe keys forgotten"] += n
			r.faultsMu.Unlock()
		}
	}
}

// waitQuiescent waits until no charge or top-up is unsettled, no charge,
// top-up or webhook job is left to run, and every period with events has a
// charge.
func (r *run) waitQuiescent(ctx context.Context) error {
	return waitQuiescent(ctx, r.dbURL, r.cfg.QuiesceMax, r.logf)
}

// waitQuiescent waits, up to quiesceMax, until the database at dbURL has
// no charge in pending, unknown, processing or past_due, no top-up in
// pending, unknown or processing, no charge_period, top_up, stripe_event or
// webhook_delivery job left to run, and a charge for every period with
// events.
// It logs progress every 10 s and returns an error describing what is left
// when the time is up.
func waitQuiescent(ctx context.Context, dbURL string, quiesceMax time.Duration, logf func(string, ...any)) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("error connecting to wait for quiescence: %w", err)
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(quiesceMax)
	lastLog := time.Now()
	var unsettled, topUps, jobs, uncharged int
	for time.Now().Before(deadline) {
		err := conn.QueryRow(ctx, `
SELECT (SELECT count(*) FROM billing.charges WHERE status IN ('pending', 'unknown', 'processing', 'past_due')),
       (SELECT count(*) FROM billing.top_ups WHERE status IN ('pending', 'unknown', 'processing')),
       (SELECT count(*) FROM river.river_job WHERE kind IN ('charge_period', 'top_up', 'stripe_event', 'webhook_delivery')
          AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled')),
       (SELECT count(*) FROM billing.periods p WHERE NOT EXISTS (
          SELECT 1 FROM billing.charges c WHERE c.customer_id = p.customer_id AND c.period = p.period))`).Scan(
			&unsettled, &topUps, &jobs, &uncharged)
		if err == nil && unsettled == 0 && topUps == 0 && jobs == 0 && uncharged == 0 {
			logf("quiescent")
			return nil
		}
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			logf("waiting: %d unsettled charges, %d unsettled top-ups, %d jobs left (%s), %d periods without a charge",
				unsettled, topUps, jobs, strings.Join(jobsLeft(ctx, conn, 3), "; "), uncharged)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	left := jobsLeft(ctx, conn, 10)
	return fmt.Errorf("not quiescent after %s: %d unsettled charges, %d unsettled top-ups, %d jobs left, %d periods without a charge; jobs: %s",
		quiesceMax, unsettled, topUps, jobs, uncharged, strings.Join(left, "; "))
}

// jobsLeft describes up to limit charge, top-up and webhook jobs not yet
// finished.
func jobsLeft(ctx context.Context, conn *pgx.Conn, limit int) []string {
	rows, err := conn.Query(ctx, `
SELECT id || ' ' || kind || ' ' || state || ' attempt ' || attempt || ' scheduled ' || to_char(scheduled_at, 'HH24:MI:SS')
       || coalesce(' last error: ' || (errors[array_length(errors, 1)]->>'error'), '')
FROM river.river_job WHERE kind IN ('charge_period', 'top_up', 'stripe_event', 'webhook_delivery')
  AND state IN ('available', 'pending', 'retryable', 'running', 'scheduled')
ORDER BY id LIMIT $1`, limit)
	if err != nil {
		return []string{err.Error()}
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return []string{err.Error()}
	}
	return left
}
