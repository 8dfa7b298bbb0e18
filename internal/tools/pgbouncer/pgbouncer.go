// Package pgbouncer runs a private PgBouncer in transaction mode in front of
// a Postgres, on a free loopback port, for the tests, the bench and the chaos
// suite: Tally's API and worker pools connect through it (TALLY_POOLER_URL)
// as they would through a production pooler. scripts/ensure-tools.sh
// installs Debian's pgbouncer (1.18: no prepared statements across
// transactions); PGBOUNCER_BIN names another binary.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tally-billing/tally/internal/tools/proc"
)

// Config describes the pooler to start.
type Config struct {
	// Dir holds its configuration, log and pid file; it is created.
	Dir string
	// Backend is a Postgres URL whose host and port the pooler connects to;
	// every database and user of that server is reachable through it.
	Backend string
	// PoolSize is the number of server connections per database and user
	// (default_pool_size); zero means 20.
	PoolSize int
}

// Bouncer is a running pooler.
type Bouncer struct {
	Port int
	p    *proc.Proc
}

// Bin returns the pgbouncer binary: $PGBOUNCER_BIN, else pgbouncer on the
// PATH or in /usr/sbin.
func Bin() (string, error) {
	if b := os.Getenv("PGBOUNCER_BIN"); b != "" {
		return b, nil
	}
	if b, err := exec.LookPath("pgbouncer"); err == nil {
		return b, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", errors.New("pgbouncer not found: run scripts/ensure-tools.sh (make test does), or set PGBOUNCER_BIN")
}

// Start starts a pooler in transaction mode in front of cfg.Backend's server
// and waits until it accepts connections. Root runs it as the postgres user
// (PgBouncer refuses to run as root). The caller stops it.
func Start(ctx context.Context, cfg Config) (*Bouncer, error) {
	bin, err := Bin()
	if err != nil {
		return nil, err
	}
	backend, err := url.Parse(cfg.Backend)
	if err != nil {
		return nil, fmt.Errorf("error parsing the backend URL: %w", err)
	}
	port, err := proc.FreePort()
	if err != nil {
		return nil, fmt.Errorf("error finding a free port: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("error creating %s: %w", cfg.Dir, err)
	}
	poolSize := cfg.PoolSize
	if poolSize == 0 {
		poolSize = 20
	}
	host, backendPort := backend.Hostname(), backend.Port()
	if backendPort == "" {
		backendPort = "5432"
	}
	users := []string{"postgres"}
	if u := backend.User.Username(); u != "" && u != "postgres" {
		users = append(users, u)
	}
	var userlist strings.Builder
	for _, u := range users {
		fmt.Fprintf(&userlist, "%q \"\"\n", u)
	}
	// auth_type trust: the pooler sits on loopback in front of a server
	// that trusts loopback; the users it admits are those listed.
	// ignore_startup_parameters: drivers send extra_float_digits; Tally's
	// pools send only application_name, which PgBouncer tracks.
	// server_login_retry: after a failed login to Postgres (a restart) the
	// pooler refuses every client for this long, 15 s by default.
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 2000
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
admin_users = postgres
server_login_retry = 1
log_connections = 0
log_disconnections = 0
`, host, backendPort, port, filepath.Join(cfg.Dir, "userlist.txt"), poolSize,
		filepath.Join(cfg.Dir, "pgbouncer.log"), filepath.Join(cfg.Dir, "pgbouncer.pid"))
	for name, content := range map[string]string{"userlist.txt": userlist.String(), "pgbouncer.ini": ini} {
		if err := os.WriteFile(filepath.Join(cfg.Dir, name), []byte(content), 0o644); err != nil {
			return nil, fmt.Errorf("error writing %s: %w", name, err)
		}
	}
	p := &proc.Proc{Name: "pgbouncer", Bin: bin, Args: []string{filepath.Join(cfg.Dir, "pgbouncer.ini")},
		LogPath: filepath.Join(cfg.Dir, "stdout.log")}
	if os.Geteuid() == 0 {
		if err := giveToPostgres(cfg.Dir); err != nil {
			return nil, err
		}
		p.Bin, p.Args = "runuser", append([]string{"-u", "postgres", "--", bin}, p.Args...)
	}
	if err := p.Start(); err != nil {
		return nil, err
	}
	b := &Bouncer{Port: port, p: p}
	if err := b.waitListening(ctx, 30*time.Second); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

// giveToPostgres makes dir the postgres user's, and every directory above it
// traversable, so that a pooler run as that user can write its log there.
func giveToPostgres(dir string) error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("running pgbouncer as root needs a postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(path, uid, gid)
	}); err != nil {
		return fmt.Errorf("error giving %s to postgres: %w", dir, err)
	}
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			_ = os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	return nil
}

func (b *Bouncer) waitListening(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !b.p.Running() {
			log, _ := os.ReadFile(filepath.Join(filepath.Dir(b.p.LogPath), "pgbouncer.log"))
			out, _ := os.ReadFile(b.p.LogPath)
			return fmt.Errorf("pgbouncer exited during start: %s%s", out, log)
		}
		if c, err := net.DialTimeout("tcp", b.addr(), time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("pgbouncer not listening on %s after %s", b.addr(), timeout)
}

func (b *Bouncer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)) }

// URL returns databaseURL (a URL of the backend's server) as it is reached
// through the pooler: the same user, database and parameters, the pooler's
// host and port.
func (b *Bouncer) URL(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", fmt.Errorf("error parsing database URL: %w", err)
	}
	u.Host = b.addr()
	return u.String(), nil
}

// Stop stops the pooler; every client connection through it is closed.
func (b *Bouncer) Stop() { b.p.Stop(5 * time.Second) }
