package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// failoverDB is the Postgres a failover drill fails over: two private
// clusters with the drill's own proxies (clusterPair), or a pg_auto_failover
// formation whose monitor promotes the standby (formationPair,
// FailoverConfig.HA).
type failoverDB interface {
	// start brings the primary and its streaming standby up (synchronous
	// with sync), creates database tally, and returns the URL Tally's
	// processes connect with.
	start(ctx context.Context, workDir, logDir string, sync bool) (string, error)
	// primaryURL and standbyURL are the admin URLs of the primary and the
	// standby as they were at the start.
	primaryURL() string
	standbyURL() string
	// stall stops the standby from receiving WAL; the primary goes on.
	stall(ctx context.Context) error
	// kill kills the primary at once.
	kill(ctx context.Context) error
	// promote returns once the standby takes writes and Tally's URL reaches
	// it.
	promote(ctx context.Context) error
	// tallyURL reaches database tally on the promoted standby.
	tallyURL() string
	describe() string
	stop()
}

// clusterPair is a primary and a standby cluster, the standby streaming
// through the repl proxy (which stalls it) and Tally reaching the primary
// through the app proxy, switched to the standby once it is promoted.
type clusterPair struct {
	primary, standby *cluster
	repl, app        *tcpProxy
}

func (p *clusterPair) start(ctx context.Context, workDir, logDir string, sync bool) (string, error) {
	var err error
	if p.primary, err = startPrimary(ctx, workDir, logDir); err != nil {
		return "", err
	}
	if p.repl, err = newTCPProxy("replication", p.primary.addr()); err != nil {
		return "", err
	}
	if p.standby, err = startStandby(ctx, p.primary, p.repl.Port(), workDir, logDir); err != nil {
		return "", err
	}
	if err := waitStreaming(ctx, p.primary, false); err != nil {
		return "", err
	}
	if sync {
		if err := syncReplicationOn(ctx, p.primary); err != nil {
			return "", err
		}
	}
	admin, err := pgx.Connect(ctx, p.primary.adminURL())
	if err != nil {
		return "", fmt.Errorf("error connecting to the primary: %w", err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE tally")
	admin.Close(context.Background())
	if err != nil {
		return "", fmt.Errorf("error creating the database: %w", err)
	}
	if p.app, err = newTCPProxy("app", p.primary.addr()); err != nil {
		return "", err
	}
	return fmt.Sprintf("postgres://postgres@%s/tally?sslmode=disable", p.app.Addr()), nil
}

func (p *clusterPair) primaryURL() string { return p.primary.adminURL() }
func (p *clusterPair) standbyURL() string { return p.standby.adminURL() }

func (p *clusterPair) stall(context.Context) error {
	p.repl.Pause()
	return nil
}

// kill stops the primary the hard way and cuts the replication proxy: what
// the standby has not received is gone.
func (p *clusterPair) kill(ctx context.Context) error {
	if err := p.primary.kill(ctx); err != nil {
		return err
	}
	return p.repl.Close()
}

func (p *clusterPair) promote(ctx context.Context) error {
	if err := p.standby.promote(ctx); err != nil {
		return err
	}
	p.app.Switch(p.standby.addr())
	return nil
}

func (p *clusterPair) tallyURL() string { return p.standby.url("tally") }

func (p *clusterPair) describe() string {
	return fmt.Sprintf("primary on %s, standby on %s streaming through %s; Tally through %s",
		p.primary.addr(), p.standby.addr(), p.repl.Addr(), p.app.Addr())
}

func (p *clusterPair) stop() {
	for _, x := range []*tcpProxy{p.app, p.repl} {
		if x != nil {
			_ = x.Close()
		}
	}
	for _, c := range []*cluster{p.standby, p.primary} {
		if c != nil {
			c.stop()
		}
	}
}

// formationPair is the pg_auto_failover formation of scripts/ha.sh: a
// primary and a secondary (asynchronous unless sync), Tally on the
// multi-host URL. The stall stops the primary's WAL senders (SIGSTOP); the
// kill is the primary's node dying (its keeper and postmaster, then the
// stopped senders); the monitor promotes the secondary by itself.
type formationPair struct {
	repoDir          string
	f                *formation
	primary, standby node
	senders          []int // the primary's WAL senders, stopped by stall
}

// node is one node of the formation, as its monitor lists it.
type node struct {
	name string
	port int
}

func (n node) adminURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", n.port)
}

func (p *formationPair) start(ctx context.Context, _, _ string, sync bool) (string, error) {
	var err error
	if p.f, err = startFormation(ctx, p.repoDir, !sync); err != nil {
		return "", err
	}
	out, err := p.f.script(ctx, "monitor-url")
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, strings.TrimSpace(out))
	if err != nil {
		return "", fmt.Errorf("error connecting to the monitor: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport, reportedstate FROM pgautofailover.node ORDER BY nodeid`)
	if err != nil {
		return "", fmt.Errorf("error listing the formation's nodes: %w", err)
	}
	var name, state string
	var port int
	_, err = pgx.ForEachRow(rows, []any{&name, &port, &state}, func() error {
		switch state {
		case "primary":
			p.primary = node{name, port}
		case "secondary":
			p.standby = node{name, port}
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("error listing the formation's nodes: %w", err)
	}
	if p.primary.name == "" || p.standby.name == "" {
		return "", errors.New("the formation has no primary and secondary")
	}
	return p.f.tally, nil
}

func (p *formationPair) primaryURL() string { return p.primary.adminURL() }
func (p *formationPair) standbyURL() string { return p.standby.adminURL() }

func (p *formationPair) stall(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.primaryURL())
	if err != nil {
		return fmt.Errorf("error connecting to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_replication`)
	if err != nil {
		return fmt.Errorf("error listing the WAL senders: %w", err)
	}
	if p.senders, err = pgx.CollectRows(rows, pgx.RowTo[int]); err != nil {
		return fmt.Errorf("error listing the WAL senders: %w", err)
	}
	if len(p.senders) == 0 {
		return errors.New("the primary has no WAL sender to stall")
	}
	for _, pid := range p.senders {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("error stopping WAL sender %d: %w", pid, err)
		}
	}
	return nil
}

func (p *formationPair) kill(ctx context.Context) error {
	out, err := p.f.script(ctx, "kill-primary")
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(out); got != p.primary.name {
		return fmt.Errorf("scripts/ha.sh killed %q, not the primary %s", got, p.primary.name)
	}
	// The stopped senders outlive their postmaster; what they never sent
	// dies with them.
	for _, pid := range p.senders {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

// promote waits for the monitor to promote the secondary: its timeouts
// (node_considered_unhealthy_timeout, primary_demote_timeout) take about
// 50 s by default.
func (p *formationPair) promote(ctx context.Context) error {
	_, err := p.f.script(ctx, "wait-failover", p.primary.name, fmt.Sprint(int(5*time.Minute/time.Second)))
	return err
}

func (p *formationPair) tallyURL() string { return p.f.tally }

func (p *formationPair) describe() string {
	return fmt.Sprintf("pg_auto_failover formation: primary %s on %d, secondary %s on %d; Tally on %s",
		p.primary.name, p.primary.port, p.standby.name, p.standby.port, p.f.tally)
}

func (p *formationPair) stop() {
	for _, pid := range p.senders {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if p.f != nil {
		p.f.stop()
	}
}
