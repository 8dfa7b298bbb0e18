package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-billing/tally/internal/jobs"
	"github.com/tally-billing/tally/internal/tools/proc"
)

// Bounds on the untimed steps, which run until their count is done.
const (
	readyTimeout   = 60 * time.Second
	setupTimeout   = 10 * time.Minute // creating customers, posting the charges phase's events
	loadTimeout    = 60 * time.Minute // loading LoadEvents before ingest_after_load
	serverStopWait = 10 * time.Second
)

// apiKeyScopes are the scopes of the run's API key.
const apiKeyScopes = "usage:write,customers:write,billing:read,admin"

// tallyServer is one cmd/server process of the run, its memory sampled
// from its start until it stops.
type tallyServer struct {
	proc    *proc.Proc
	url     string
	stopRSS func()
}

// startServer starts cmd/server as name on dbURL, bound to a free port on
// 127.0.0.1, with TALLY_WORKERS set to Workers and env added, and waits
// until it answers /readyz.
func (r *run) startServer(ctx context.Context, name, dbURL string, env ...string) (*tallyServer, error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, fmt.Errorf("error finding a free port for %s: %w", name, err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	p := &proc.Proc{Name: name, Bin: filepath.Join(r.binDir, "server"),
		Env: append([]string{"DATABASE_URL=" + dbURL, fmt.Sprintf("TALLY_HTTP_ADDR=127.0.0.1:%d", port),
			"TALLY_WORKERS=" + strconv.Itoa(r.cfg.Workers), "TALLY_SHUTDOWN_TIMEOUT=5s", "TALLY_METRICS_ADDR=off"}, env...),
		LogPath: filepath.Join(r.logDir, name+".log"), Ready: url + "/readyz"}
	if err := p.Start(); err != nil {
		return nil, err
	}
	s := &tallyServer{proc: p, url: url, stopRSS: r.mem.watch(name, p.Pid())}
	if err := p.WaitReady(ctx, readyTimeout); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// stop reads the server's peak memory, then stops it.
func (s *tallyServer) stop() {
	s.stopRSS()
	s.proc.Stop(serverStopWait)
}

// tallyDatabase creates a database for Tally servers — a fresh one,
// migrated, whose ledger is empty, or with preloaded a clone of the run's
// preloaded ledger (preload.go) — and an API key with every scope in it
// (with billingctl), and returns the database's URL and the key's secret
// (the last line billingctl prints).
func (r *run) tallyDatabase(ctx context.Context, suffix string, preloaded bool) (dbURL, key string, err error) {
	if preloaded {
		if dbURL, err = r.clonePreloaded(ctx, suffix); err != nil {
			return "", "", err
		}
	} else if dbURL, err = r.migratedDatabase(ctx, suffix); err != nil {
		return "", "", err
	}
	out, err := proc.RunTool(ctx, filepath.Join(r.binDir, "billingctl"), []string{"DATABASE_URL=" + dbURL},
		"apikey", "create", "--name", "bench", "--scopes", apiKeyScopes)
	if err != nil {
		return "", "", fmt.Errorf("error creating an API key: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return dbURL, strings.TrimSpace(lines[len(lines)-1]), nil
}

// migratedDatabase creates a fresh database named after the run and suffix,
// migrates it with the built migrate command (the server's own migrations,
// whichever checkout it was built from), and returns its URL.
func (r *run) migratedDatabase(ctx context.Context, suffix string) (string, error) {
	dbURL, err := r.createEmptyDatabase(ctx, suffix)
	if err != nil {
		return "", err
	}
	if _, err := proc.RunTool(ctx, filepath.Join(r.binDir, "migrate"), []string{"DATABASE_URL=" + dbURL}, "up"); err != nil {
		return "", fmt.Errorf("error migrating: %w", err)
	}
	return dbURL, nil
}

// putCustomers creates or updates the customers through the API, Clients
// at a time, with usage thresholds (a JSON array; "": none).
func (r *run) putCustomers(ctx context.Context, api *apiClient, customers []string, thresholds string) error {
	lr := eachOnce(ctx, r.cfg.Clients, len(customers), setupTimeout, func(ctx context.Context, _, k int) (int, error) {
		return 1, api.customerPut(ctx, customers[k], thresholds)
	})
	if lr.errors > 0 || lr.units != int64(len(customers)) {
		return fmt.Errorf("error putting %d customers with thresholds %q (%d put, %d failed): %w",
			len(customers), thresholds, lr.units, lr.errors, lr.firstErr)
	}
	r.logf("put %d customers (thresholds %q) in %s", len(customers), thresholds, lr.elapsed.Round(time.Millisecond))
	return nil
}

// openPeriods posts one single event per customer, Clients at a time, so
// that every customer's current period (with its charge job) exists before
// the timed phases: opening a period happens once per customer and period,
// and would otherwise weigh on whichever phase first touches each customer.
func (r *run) openPeriods(ctx context.Context, api *apiClient, customers []string) (string, error) {
	lr := eachOnce(ctx, r.cfg.Clients, len(customers), setupTimeout, func(ctx context.Context, _, k int) (int, error) {
		ev := event{customer: customers[k], id: "open-0", amount: 1}
		return 1, api.do(ctx, http.MethodPost, pathEvent, appendEvent(nil, ev))
	})
	if lr.errors > 0 || lr.units != int64(len(customers)) {
		return "", fmt.Errorf("error opening the periods of %d customers (%d opened, %d failed): %w", len(customers), lr.units, lr.errors, lr.firstErr)
	}
	r.logf("opened the current period of %d customers with one event each in %s (%s events/s)",
		len(customers), lr.elapsed.Round(time.Millisecond), formatRate(lr.rate()))
	return fmt.Sprintf("%d clients, single events over %d customers whose periods were opened beforehand (%s events/s while opening them)",
		r.cfg.Clients, len(customers), formatRate(lr.rate())), nil
}

// ingest runs the ingest rotations against one server (TALLY_ROLES=api)
// started on a fresh database whose events table is empty, never restarted
// between them, and the raw baselines in the baselines' database, in
// alternating windows.
func (r *run) ingest(ctx context.Context) error {
	baseURL, err := r.baseDatabase(ctx)
	if err != nil {
		return err
	}
	dbURL, key, err := r.tallyDatabase(ctx, "ingest", false)
	if err != nil {
		return err
	}
	srv, err := r.startServer(ctx, "api-ingest", dbURL, "TALLY_ROLES=api")
	if err != nil {
		return err
	}
	defer srv.stop()
	api := newAPIClient(srv.url, key, max(r.cfg.Clients, loadClients))
	defer api.close()
	customers := customerIDs(r.cfg.Customers)
	if err := r.putCustomers(ctx, api, customers, ""); err != nil {
		return err
	}
	spreadNote, err := r.openPeriods(ctx, api, customers)
	if err != nil {
		return err
	}
	// With --pgbouncer, a second server on the same database whose pools
	// go through PgBouncer takes its windows in the same rotations.
	var pooled *apiClient
	if r.cfg.runsAny(PhaseIngestSpreadPooled, PhaseIngestBatchPooled) {
		poolerURL, err := r.poolerURL(ctx, dbURL)
		if err != nil {
			return err
		}
		psrv, err := r.startServer(ctx, "api-ingest-pgbouncer", dbURL, "TALLY_ROLES=api", "TALLY_POOLER_URL="+poolerURL)
		if err != nil {
			return err
		}
		defer psrv.stop()
		pooled = newAPIClient(psrv.url, key, max(r.cfg.Clients, loadClients))
		defer pooled.close()
	}
	// With --preload, a server on a clone of the preloaded ledger, its
	// customers put and their periods opened as on the empty one, takes
	// its windows in the same rotations too.
	var preloaded *apiClient
	var preURL string
	if r.cfg.runsAny(PhaseIngestSpreadPreloaded, PhaseIngestBatchPreloaded) {
		var preKey string
		if preURL, preKey, err = r.tallyDatabase(ctx, "ingest_pre", true); err != nil {
			return err
		}
		defer r.releaseDatabase(preURL) // after the server stops
		presrv, err := r.startServer(ctx, "api-ingest-preloaded", preURL, "TALLY_ROLES=api")
		if err != nil {
			return err
		}
		defer presrv.stop()
		preloaded = newAPIClient(presrv.url, preKey, max(r.cfg.Clients, loadClients))
		defer preloaded.close()
		if err := r.putCustomers(ctx, preloaded, customers, ""); err != nil {
			return err
		}
		if _, err := r.openPeriods(ctx, preloaded, customers); err != nil {
			return err
		}
	}

	if r.cfg.runsAny(PhaseRawSQL, PhaseRawSQLPipelined, PhaseIngestSpread, PhaseIngestHot) {
		if err := r.singlesRotation(ctx, api, pooled, preloaded, baseURL, customers, spreadNote); err != nil {
			return err
		}
	}
	if r.cfg.runs(PhaseIngestSerial) {
		if err := r.serialRotation(ctx, api, dbURL, customers); err != nil {
			return err
		}
	}
	if err := r.phases(step{PhaseIngestRollups, func() (*Result, error) {
		return r.ingestRollups(ctx, api, dbURL, customers)
	}}); err != nil {
		return err
	}
	if r.cfg.runsAny(PhaseRawCopy, PhaseIngestBatch) {
		if err := r.batchRotation(ctx, api, pooled, preloaded, baseURL, customers); err != nil {
			return err
		}
	}
	if preloaded != nil {
		// The preloaded clone takes no more events: what its ingest
		// phases left to VACUUM, and the usage query on either ledger (of
		// a customer of the spread, not ingest_hot's first).
		if err := r.ledgerAfterIngest(ctx, preURL, dbURL, preloaded, api, customers[len(customers)/2]); err != nil {
			if err := r.record(nil, err); err != nil {
				return err
			}
		}
	}
	if r.cfg.runs(PhaseIngestAfterLoad) {
		return r.afterLoadRotation(ctx, api, baseURL, customers)
	}
	return nil
}

// recordRotation records a rotation's outcome: its failure (err), or each
// phase's windows merged into its result, noted with notes[phase].
func (r *run) recordRotation(windows map[string][]loopResult, err error, notes map[string]string) error {
	if err != nil {
		return r.record(nil, err)
	}
	for _, phase := range Phases {
		if lrs, ok := windows[phase]; ok {
			res := loopsResult(phase, mergeLoops(lrs), notes[phase])
			for _, lr := range lrs {
				if len(lr.latencies) > 0 {
					res.WindowP99 = append(res.WindowP99, percentile(lr.latencies, 0.99))
				}
			}
			if err := r.record(res, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// rotationNote is the note of a phase measured in a rotation.
func (r *run) rotationNote(note string, members ...string) string {
	return fmt.Sprintf("%s; %d window(s) of %s each in rotation (%s)", note, r.rounds(), r.cfg.Duration, strings.Join(members, ", "))
}

// singlesRotation measures raw_sql, raw_sql_pipelined, ingest_spread and
// ingest_hot in turn, round after round, and ingest_spread_pgbouncer through
// pooled and ingest_spread_preloaded through preloaded when not nil.
func (r *run) singlesRotation(ctx context.Context, api, pooled, preloaded *apiClient, baseURL string, customers []string, spreadNote string) error {
	conns, err := connectEach(ctx, baseURL, r.cfg.Clients)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	names := []string{PhaseRawSQL, PhaseRawSQLPipelined, PhaseIngestSpread, PhaseIngestHot}
	raw := func(phase string, pipelined bool) member {
		return member{phase, func(round int) (loopResult, error) {
			lr := r.rawSQLWindow(ctx, conns, pipelined, phase+strconv.Itoa(round))
			return lr, loopError(phase, lr)
		}}
	}
	singles := func(phase, prefix string, api *apiClient, customers []string) member {
		return member{phase, func(round int) (loopResult, error) {
			lr := r.singlesLoop(ctx, api, r.cfg.Clients, prefix+strconv.Itoa(round), customers, r.cfg.Duration)
			return lr, loopError(phase, lr)
		}}
	}
	members := []member{raw(PhaseRawSQL, false), raw(PhaseRawSQLPipelined, true),
		singles(PhaseIngestSpread, "sp", api, customers), singles(PhaseIngestHot, "hot", api, customers[:1])}
	if pooled != nil {
		names = append(names, PhaseIngestSpreadPooled)
		members = append(members, singles(PhaseIngestSpreadPooled, "spb", pooled, customers))
	}
	if preloaded != nil {
		names = append(names, PhaseIngestSpreadPreloaded)
		members = append(members, singles(PhaseIngestSpreadPreloaded, "spp", preloaded, customers))
	}
	r.logf("%s: %d rounds of %s windows, %d clients", strings.Join(names, ", "), r.rounds(), r.cfg.Duration, r.cfg.Clients)
	windows, err := r.rotate(r.rounds(), members...)
	err = r.recordRotation(windows, err, map[string]string{
		PhaseRawSQL:                r.rotationNote(rawSQLNote, names...),
		PhaseRawSQLPipelined:       r.rotationNote(rawSQLPipelinedNote, names...),
		PhaseIngestSpread:          r.rotationNote(spreadNote, names...),
		PhaseIngestHot:             r.rotationNote(fmt.Sprintf("%d clients, single events to 1 customer", r.cfg.Clients), names...),
		PhaseIngestSpreadPooled:    r.rotationNote(spreadNote+"; through PgBouncer (transaction mode)", names...),
		PhaseIngestSpreadPreloaded: r.rotationNote(spreadNote+"; "+r.preloadedNote(), names...),
	})
	if err != nil || windows == nil {
		return err
	}
	r.pair(PhaseIngestSpread, PhaseRawSQL, windows[PhaseIngestSpread], windows[PhaseRawSQL])
	r.pair(PhaseIngestSpread, PhaseRawSQLPipelined, windows[PhaseIngestSpread], windows[PhaseRawSQLPipelined])
	r.pair(PhaseIngestHot, PhaseIngestSpread, windows[PhaseIngestHot], windows[PhaseIngestSpread])
	if pooled != nil {
		r.pair(PhaseIngestSpreadPooled, PhaseIngestSpread, windows[PhaseIngestSpreadPooled], windows[PhaseIngestSpread])
	}
	if preloaded != nil {
		r.pair(PhaseIngestSpreadPreloaded, PhaseIngestSpread, windows[PhaseIngestSpreadPreloaded], windows[PhaseIngestSpread])
	}
	return nil
}

// serialRotation measures one client posting single events to a second
// server on the same database that writes every event alone
// (TALLY_INGEST_GROUP_MAX=1, ingest_serial_ungrouped), then to the
// grouping server (ingest_serial), round after round: a lone client must
// not wait for a group.
func (r *run) serialRotation(ctx context.Context, api *apiClient, dbURL string, customers []string) error {
	alone, err := r.startServer(ctx, "api-ungrouped", dbURL, "TALLY_ROLES=api", "TALLY_INGEST_GROUP_MAX=1")
	if err != nil {
		return err
	}
	defer alone.stop()
	aloneAPI := newAPIClient(alone.url, api.key, 1)
	defer aloneAPI.close()
	names := []string{PhaseIngestSerialAlone, PhaseIngestSerial}
	r.logf("%s: %d rounds of %s windows, 1 client", strings.Join(names, ", "), r.rounds(), r.cfg.Duration)
	serial := func(phase, prefix string, api *apiClient) member {
		return member{phase, func(round int) (loopResult, error) {
			lr := r.singlesLoop(ctx, api, 1, prefix+strconv.Itoa(round), customers, r.cfg.Duration)
			return lr, loopError(phase, lr)
		}}
	}
	windows, err := r.rotate(r.rounds(), serial(PhaseIngestSerialAlone, "su", aloneAPI), serial(PhaseIngestSerial, "sg", api))
	err = r.recordRotation(windows, err, map[string]string{
		PhaseIngestSerialAlone: r.rotationNote("1 client, single events, a server writing each alone (TALLY_INGEST_GROUP_MAX=1)", names...),
		PhaseIngestSerial:      r.rotationNote("1 client, single events, the grouping server", names...),
	})
	if err != nil || windows == nil {
		return err
	}
	var ratios []float64
	for i, g := range windows[PhaseIngestSerial] {
		if u := windows[PhaseIngestSerialAlone][i]; len(u.latencies) > 0 && len(g.latencies) > 0 {
			ratios = append(ratios, float64(percentile(g.latencies, 0.5))/float64(percentile(u.latencies, 0.5)))
		}
	}
	r.pairRatios(PhaseIngestSerial+" p50", PhaseIngestSerialAlone, ratios)
	return nil
}

// batchRotation measures raw_copy and ingest_batch in turn, round after
// round, and ingest_batch_pgbouncer through pooled and
// ingest_batch_preloaded through preloaded when not nil.
func (r *run) batchRotation(ctx context.Context, api, pooled, preloaded *apiClient, baseURL string, customers []string) error {
	conns, err := connectEach(ctx, baseURL, copyWriters)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	names := []string{PhaseRawCopy, PhaseIngestBatch}
	rnds := clientRands(copyWriters, 4)
	batches := func(phase, prefix string, api *apiClient) member {
		return member{phase, func(round int) (loopResult, error) {
			lr := closedLoop(ctx, copyWriters, r.cfg.Duration, 0, func(ctx context.Context, c, seq int) (int, error) {
				return batchSize, api.do(ctx, http.MethodPost, pathBatch,
					randomBatch(rnds[c], customers, eventID(prefix+strconv.Itoa(round), c, seq), batchSize))
			})
			return lr, loopError(phase, lr)
		}}
	}
	members := []member{
		{PhaseRawCopy, func(round int) (loopResult, error) {
			lr := r.rawCopyWindow(ctx, conns, "copy"+strconv.Itoa(round))
			return lr, loopError(PhaseRawCopy, lr)
		}},
		batches(PhaseIngestBatch, "b", api),
	}
	if pooled != nil {
		names = append(names, PhaseIngestBatchPooled)
		members = append(members, batches(PhaseIngestBatchPooled, "bb", pooled))
	}
	if preloaded != nil {
		names = append(names, PhaseIngestBatchPreloaded)
		members = append(members, batches(PhaseIngestBatchPreloaded, "bp", preloaded))
	}
	r.logf("%s: %d rounds of %s windows, %d clients, %d events a call", strings.Join(names, ", "), r.rounds(), r.cfg.Duration,
		copyWriters, batchSize)
	windows, err := r.rotate(r.rounds(), members...)
	batchNote := fmt.Sprintf("%d clients, %d events per batch", copyWriters, batchSize)
	err = r.recordRotation(windows, err, map[string]string{
		PhaseRawCopy:              r.rotationNote(fmt.Sprintf("%d writers, %d rows per COPY", copyWriters, batchSize), names...),
		PhaseIngestBatch:          r.rotationNote(batchNote, names...),
		PhaseIngestBatchPooled:    r.rotationNote(batchNote+"; through PgBouncer (transaction mode)", names...),
		PhaseIngestBatchPreloaded: r.rotationNote(batchNote+"; "+r.preloadedNote(), names...),
	})
	if err != nil || windows == nil {
		return err
	}
	r.pair(PhaseIngestBatch, PhaseRawCopy, windows[PhaseIngestBatch], windows[PhaseRawCopy])
	if pooled != nil {
		r.pair(PhaseIngestBatchPooled, PhaseIngestBatch, windows[PhaseIngestBatchPooled], windows[PhaseIngestBatch])
	}
	if preloaded != nil {
		r.pair(PhaseIngestBatchPreloaded, PhaseIngestBatch, windows[PhaseIngestBatchPreloaded], windows[PhaseIngestBatch])
	}
	return nil
}

// afterLoadRotation loads LoadEvents events through the batch API, then
// measures raw_sql and ingest_spread again in turn (raw_sql_after_load,
// ingest_after_load), round after round. ingest_after_load is judged
// against ingest_spread through raw_sql: each round's ratio to raw_sql,
// over the median ratio of ingest_spread to raw_sql before the load.
func (r *run) afterLoadRotation(ctx context.Context, api *apiClient, baseURL string, customers []string) error {
	note, err := r.load(ctx, api, customers)
	if err != nil {
		return r.record(nil, err)
	}
	conns, err := connectEach(ctx, baseURL, r.cfg.Clients)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	names := []string{PhaseRawSQLAfterLoad, PhaseIngestAfterLoad}
	windows, err := r.rotate(r.rounds(),
		member{PhaseRawSQLAfterLoad, func(round int) (loopResult, error) {
			lr := r.rawSQLWindow(ctx, conns, false, "rawal"+strconv.Itoa(round))
			return lr, loopError(PhaseRawSQLAfterLoad, lr)
		}},
		member{PhaseIngestAfterLoad, func(round int) (loopResult, error) {
			lr := r.singlesLoop(ctx, api, r.cfg.Clients, "al"+strconv.Itoa(round), customers, r.cfg.Duration)
			return lr, loopError(PhaseIngestAfterLoad, lr)
		}})
	err = r.recordRotation(windows, err, map[string]string{
		PhaseRawSQLAfterLoad: r.rotationNote(rawSQLNote+", "+note, names...),
		PhaseIngestAfterLoad: r.rotationNote(fmt.Sprintf("%d clients, single events, %s", r.cfg.Clients, note), names...),
	})
	if err != nil || windows == nil {
		return err
	}
	before := r.report.Pairs[pairKey(PhaseIngestSpread, PhaseRawSQL)]
	if len(before) == 0 {
		return nil // ingest_spread not measured: nothing to judge against
	}
	spread := median(before)
	var ratios []float64
	for i, al := range windows[PhaseIngestAfterLoad] {
		if raw := windows[PhaseRawSQLAfterLoad][i].rate(); raw > 0 {
			ratios = append(ratios, al.rate()/raw/spread)
		}
	}
	r.pairRatios(PhaseIngestAfterLoad, PhaseIngestSpread, ratios)
	return nil
}

// thresholdsBench are the usage thresholds every customer gets in
// ingest_rollups, in cents: a customer receives a few hundred cents of
// events a second over all customers, so the lower ones are crossed during
// the phase and the highest keeps every customer a candidate of each
// roll-up's threshold check.
const thresholdsBench = "[2000,8000,50000]"

// rollupRounds is how many pairs of windows ingest_rollups measures.
const rollupRounds = 3

// rollupCatchUpMax bounds the wait for a worker replica's roll-ups to add
// the events of the window before (ingest_rollups).
const rollupCatchUpMax = 2 * time.Minute

// ingestRollups measures what the usage roll-ups and the usage thresholds
// they check cost single-event ingest (GitHub issues 14 and 24 want at most
// 5%): it posts as ingest_spread does, every customer with thresholdsBench,
// in rollupRounds pairs of windows of Duration, each with a worker replica
// (api,worker, so that /readyz answers; nothing posts to its API) started
// for it — one that rolls up once when it starts and not again within the
// window (ingest_rollups_off), then one rolling up every
// jobs.UsageRollupIntervalDefault (ingest_rollups) — so the two sides share
// the server, a worker's own upkeep, the table's size and the machine's
// moods. The rolling worker has added the window before when its window
// starts, so a window pays for its own events only.
func (r *run) ingestRollups(ctx context.Context, api *apiClient, dbURL string, customers []string) (*Result, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	count := func() (n int64) {
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM billing.usage_thresholds_reached`).Scan(&n)
		return n
	}
	if err := r.putCustomers(ctx, api, customers, thresholdsBench); err != nil {
		return nil, &phaseError{phase: PhaseIngestRollups, err: err}
	}
	window, rounds := r.cfg.Duration, rollupRounds
	if r.cfg.Short {
		rounds = 1
	}
	r.logf("%s: %d rounds of %s with a worker not rolling up, then %s with one rolling up every %s (thresholds %s cents)",
		PhaseIngestRollups, rounds, window, window, jobs.UsageRollupIntervalDefault, thresholdsBench)
	var off, on []loopResult
	var reached int64
	for round := range rounds {
		lr, err := r.rollupWindow(ctx, api, conn, dbURL, "ro"+strconv.Itoa(round), customers, false)
		if err != nil {
			return nil, err
		}
		off = append(off, lr)
		before := count()
		if lr, err = r.rollupWindow(ctx, api, conn, dbURL, "r"+strconv.Itoa(round), customers, true); err != nil {
			return nil, err
		}
		on = append(on, lr)
		reached += count() - before
	}
	note := func(with string) string {
		return fmt.Sprintf("%d clients, single events over %d customers with thresholds %s cents, %s; %d windows of %s interleaved with the other side",
			r.cfg.Clients, len(customers), thresholdsBench, with, rounds, window)
	}
	r.pair(PhaseIngestRollups, PhaseIngestRollupsOff, on, off)
	offRes := loopsResult(PhaseIngestRollupsOff, mergeLoops(off), note("a worker not rolling up"))
	if err := r.record(offRes, nil); err != nil {
		return nil, err
	}
	return loopsResult(PhaseIngestRollups, mergeLoops(on), note(fmt.Sprintf(
		"a worker rolling up every %s (%d thresholds reached in its windows)", jobs.UsageRollupIntervalDefault, reached))), nil
}

// rollupWindow posts one window of ingest_rollups with a worker replica of
// its own, rolling up every jobs.UsageRollupIntervalDefault (rolling) or
// only once, when it starts.
func (r *run) rollupWindow(ctx context.Context, api *apiClient, conn *pgx.Conn, dbURL, prefix string, customers []string, rolling bool) (loopResult, error) {
	interval := jobs.UsageRollupIntervalDefault
	if !rolling {
		interval = 24 * time.Hour
	}
	var startedAt time.Time
	if err := conn.QueryRow(ctx, `SELECT now()`).Scan(&startedAt); err != nil {
		return loopResult{}, err
	}
	worker, err := r.startServer(ctx, "worker-"+prefix, dbURL, "TALLY_ROLES=api,worker",
		"TALLY_USAGE_ROLLUP_INTERVAL="+interval.String(),
		"STRIPE_API_KEY=sk_test_bench", "STRIPE_API_BASE=http://127.0.0.1:9") // no charge is due: Stripe is never called
	if err != nil {
		return loopResult{}, err
	}
	defer worker.stop()
	if rolling {
		err = rollupCaughtUp(ctx, conn, rollupCatchUpMax)
	} else {
		err = rollupRanSince(ctx, conn, startedAt) // its one roll-up, at its start, not in the window
	}
	if err != nil {
		return loopResult{}, &phaseError{phase: PhaseIngestRollups, err: err}
	}
	if err := r.checkpoint(ctx); err != nil {
		return loopResult{}, err
	}
	lr := r.singlesLoop(ctx, api, r.cfg.Clients, prefix, customers, r.cfg.Duration)
	return lr, loopError(PhaseIngestRollups, lr)
}

// rollupRanSince waits until a roll-up has run since t, within
// rollupCatchUpMax.
func rollupRanSince(ctx context.Context, conn *pgx.Conn, t time.Time) error {
	for deadline := time.Now().Add(rollupCatchUpMax); ; time.Sleep(100 * time.Millisecond) {
		var ran bool
		if err := conn.QueryRow(ctx, `SELECT rolled_at >= $1 FROM billing.usage_rollup_watermark`, t).Scan(&ran); err != nil {
			return err
		}
		if ran {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no roll-up ran in %s", rollupCatchUpMax)
		}
	}
}

// rollupCaughtUp waits until the roll-ups hold every event committed when
// it was called, within bound.
func rollupCaughtUp(ctx context.Context, conn *pgx.Conn, bound time.Duration) error {
	var last int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM billing.usage_events`).Scan(&last); err != nil {
		return err
	}
	for deadline := time.Now().Add(bound); ; time.Sleep(100 * time.Millisecond) {
		var rolled int64
		if err := conn.QueryRow(ctx, `SELECT event_id FROM billing.usage_rollup_watermark`).Scan(&rolled); err != nil {
			return err
		}
		if rolled >= last {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the roll-ups reached event %d of %d in %s", rolled, last, bound)
		}
	}
}

// singlesLoop posts single events from clients clients for d, each to a
// customer drawn at random from customers, with ids prefix-client-seq.
func (r *run) singlesLoop(ctx context.Context, api *apiClient, clients int, prefix string, customers []string, d time.Duration) loopResult {
	rnds := clientRands(clients, 3)
	return closedLoop(ctx, clients, d, 0, func(ctx context.Context, c, seq int) (int, error) {
		ev := event{customer: customers[rnds[c].IntN(len(customers))], id: eventID(prefix, c, seq),
			amount: 1 + rnds[c].Int64N(1000)}
		return 1, api.do(ctx, http.MethodPost, pathEvent, appendEvent(make([]byte, 0, 128), ev))
	})
}

// mergeLoops adds up loops measured one after the other.
func mergeLoops(loops []loopResult) loopResult {
	var m loopResult
	for _, lr := range loops {
		m.ops += lr.ops
		m.units += lr.units
		m.errors += lr.errors
		m.elapsed += lr.elapsed
		m.latencies = append(m.latencies, lr.latencies...)
		if m.firstErr == nil {
			m.firstErr = lr.firstErr
		}
	}
	slices.Sort(m.latencies)
	return m
}

// loopsResult is the Result of phase from lr, with note.
func loopsResult(phase string, lr loopResult, note string) *Result {
	return &Result{Phase: phase, Unit: "events/s", Count: lr.units, Calls: lr.ops, Elapsed: lr.elapsed,
		Latency: newLatency(lr.latencies), Note: note}
}

// load posts LoadEvents events through the batch API from loadClients
// clients and returns a note on how long it took.
func (r *run) load(ctx context.Context, api *apiClient, customers []string) (string, error) {
	total := r.cfg.LoadEvents
	batches := (total + batchSize - 1) / batchSize
	r.logf("%s: loading %d events in %d batches from %d clients", PhaseIngestAfterLoad, total, batches, loadClients)
	rnds := clientRands(loadClients, 5)
	lr := eachOnce(ctx, loadClients, batches, loadTimeout, func(ctx context.Context, c, k int) (int, error) {
		size := min(batchSize, total-k*batchSize)
		return size, api.do(ctx, http.MethodPost, pathBatch, randomBatch(rnds[c], customers, eventID("ld", k, 0), size))
	})
	if err := loopError(PhaseIngestAfterLoad, lr); err != nil {
		return "", err
	}
	if lr.units != int64(total) {
		return "", &phaseError{phase: PhaseIngestAfterLoad, err: fmt.Errorf("loaded %d of %d events within %s", lr.units, total, loadTimeout)}
	}
	r.logf("%s: loaded %d events in %s (%s events/s)", PhaseIngestAfterLoad, total, lr.elapsed.Round(time.Millisecond), formatRate(lr.rate()))
	return fmt.Sprintf("after loading %s events through the batch API in %s (%s events/s), same server",
		formatCount(int64(total)), lr.elapsed.Round(100*time.Millisecond), formatRate(lr.rate())), nil
}

// eventID returns a unique event id: prefix-a-b.
func eventID(prefix string, a, b int) string {
	return prefix + "-" + strconv.Itoa(a) + "-" + strconv.Itoa(b)
}

// randomBatch returns the body of a batch of size events with ids
// idPrefix-0 … idPrefix-(size-1), each to a random customer.
func randomBatch(rnd *rand.Rand, customers []string, idPrefix string, size int) []byte {
	events := make([]event, size)
	for i := range events {
		events[i] = event{customer: customers[rnd.IntN(len(customers))], id: idPrefix + "-" + strconv.Itoa(i),
			amount: 1 + rnd.Int64N(1000)}
	}
	return appendBatch(make([]byte, 0, size*80), events)
}
