package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/tally-billing/tally/internal/tools/proc"
)

// cluster is a private Postgres cluster the run owns, so restarting it
// touches nothing else on the machine.
type cluster struct {
	binDir  string
	dataDir string
	port    int
	asUser  string // run pg binaries as this user (postgres when we are root)
	logPath string // server log; empty: postgres.log in the data directory
}

func (c *cluster) adminURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

func (c *cluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// pgBinDir finds the newest installed Postgres server binaries.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("no Postgres server binaries found: run scripts/ensure-postgres.sh once (it installs them)")
}

func (c *cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	bin := filepath.Join(c.binDir, name)
	if c.asUser != "" {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", c.asUser, "--", bin}, args...)...)
	}
	return exec.CommandContext(ctx, bin, args...)
}

// startCluster initialises and starts a cluster under workDir on a free port.
func startCluster(ctx context.Context, workDir string) (*cluster, error) {
	c, err := initCluster(ctx, workDir, "pg", `
max_connections = 400
shared_buffers = 128MB
synchronous_commit = off
full_page_writes = off
`)
	if err != nil {
		return nil, err
	}
	return c, c.pgctl(ctx, "start")
}

// initCluster initialises a cluster (initdb, trust authentication, superuser
// postgres) with the newest Postgres binaries in workDir/dir, on a free port,
// and configures it with what every cluster of a run shares, then conf, its
// own settings: it listens on 127.0.0.1 and on a socket in its data
// directory, does not fsync (no host crash is simulated, only process
// deaths), and logs warnings and worse. The caller starts it.
func initCluster(ctx context.Context, workDir, dir, conf string) (*cluster, error) {
	binDir, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	port, err := proc.FreePort()
	if err != nil {
		return nil, fmt.Errorf("error finding a port: %w", err)
	}
	c := &cluster{binDir: binDir, dataDir: filepath.Join(workDir, dir), port: port}
	if err := c.prepareDataDir(workDir); err != nil {
		return nil, err
	}
	if out, err := c.command(ctx, "initdb", "-D", c.dataDir, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	shared := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
fsync = off
log_min_messages = warning
`, c.port, c.dataDir)
	if err := c.appendConf(shared + conf); err != nil {
		return nil, err
	}
	return c, nil
}

// prepareDataDir creates the cluster's (empty) data directory. As root it
// runs the pg binaries as the postgres user: the directory is given to that
// user, and every directory from workDir up is made traversable by it.
func (c *cluster) prepareDataDir(workDir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	c.asUser = "postgres"
	uid, gid, err := postgresUser()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return fmt.Errorf("error creating data directory %s: %w", c.dataDir, err)
	}
	if err := os.Chown(c.dataDir, uid, gid); err != nil {
		return fmt.Errorf("error giving data directory %s to postgres: %w", c.dataDir, err)
	}
	// The postgres user must be able to reach the data directory.
	for d := workDir; d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			_ = os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	return nil
}

// postgresUser returns the uid and gid of the postgres user.
func postgresUser() (int, int, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return 0, 0, fmt.Errorf("running as root needs a postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// appendConf appends settings to the cluster's postgresql.conf; a later
// line wins over an earlier one. They apply at the next start or reload.
func (c *cluster) appendConf(conf string) error {
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("error opening postgresql.conf of %s: %w", c.dataDir, err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("error appending to postgresql.conf of %s: %w", c.dataDir, err)
	}
	return nil
}

func (c *cluster) pgctl(ctx context.Context, action string, extra ...string) error {
	logPath := c.logPath
	if logPath == "" {
		logPath = filepath.Join(c.dataDir, "postgres.log")
	}
	args := append([]string{"-D", c.dataDir, "-w", "-t", "60", "-l", logPath, action}, extra...)
	if out, err := c.command(ctx, "pg_ctl", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl %s: %w: %s", action, err, out)
	}
	return nil
}

// restart stops the cluster fast (every connection dies) and starts it.
func (c *cluster) restart(ctx context.Context, down func()) error {
	down()
	return c.pgctl(ctx, "restart", "-m", "fast")
}

// stop stops the cluster; it is called on every exit path.
func (c *cluster) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = c.pgctl(ctx, "stop", "-m", "immediate")
}
