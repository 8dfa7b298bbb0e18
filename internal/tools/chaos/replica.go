package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tally-billing/tally/internal/tools/proc"
)

// standbyAppName is the standby's application_name, as pg_stat_replication
// on the primary shows it.
const standbyAppName = "tally_standby"

// replicationTimeout bounds each wait on replication: the standby starting
// to stream, catching up, becoming synchronous.
const replicationTimeout = 60 * time.Second

// startPrimary initialises and starts a cluster under workDir/pg-primary on
// a free port, set up to stream its WAL to a standby (wal_level replica,
// WAL senders, 256 MB of WAL kept). Commits wait for the local WAL write
// (synchronous_commit on) but for no standby; syncReplicationOn changes
// that. Its log goes to logDir/postgres-primary.log.
func startPrimary(ctx context.Context, workDir, logDir string) (*cluster, error) {
	// fsync stays off (initCluster); the WAL is still written before a
	// commit returns, and only written WAL is streamed.
	c, err := initCluster(ctx, workDir, "pg-primary", `
max_connections = 200
shared_buffers = 32MB
synchronous_commit = on
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
wal_keep_size = 256MB
wal_sender_timeout = 60s
`)
	if err != nil {
		return nil, fmt.Errorf("error initialising the primary: %w", err)
	}
	if c.logPath, err = clusterLog(logDir, "postgres-primary.log"); err != nil {
		return nil, err
	}
	if err := c.pgctl(ctx, "start"); err != nil {
		return nil, fmt.Errorf("error starting the primary: %w", err)
	}
	return c, nil
}

// startStandby makes a streaming standby of primary with pg_basebackup
// (-R -X stream -c fast) under workDir/pg-standby, on its own port and
// socket directory, and starts it. Its primary_conninfo (written by -R)
// points at replPort, the replication proxy's port on 127.0.0.1, so the
// proxy can stall the stream. Its log goes to logDir/postgres-standby.log.
func startStandby(ctx context.Context, primary *cluster, replPort int, workDir, logDir string) (*cluster, error) {
	port, err := proc.FreePort()
	if err != nil {
		return nil, fmt.Errorf("error finding a port for the standby: %w", err)
	}
	c := &cluster{binDir: primary.binDir, dataDir: filepath.Join(workDir, "pg-standby"), port: port}
	if err := c.prepareDataDir(workDir); err != nil {
		return nil, err
	}
	if c.asUser == "" {
		if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
			return nil, fmt.Errorf("error creating the standby's data directory: %w", err)
		}
	}
	if c.logPath, err = clusterLog(logDir, "postgres-standby.log"); err != nil {
		return nil, err
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", replPort, standbyAppName)
	if out, err := c.command(ctx, "pg_basebackup", "-D", c.dataDir, "-d", conninfo, "-R", "-X", "stream", "-c", "fast", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("error copying the primary: pg_basebackup: %w: %s", err, out)
	}
	// The copy carries the primary's postgresql.conf; later lines win. A
	// short wal_retrieve_retry_interval: once the primary is gone, the
	// startup process notices a promote request only between retries
	// (5 s by default).
	conf := fmt.Sprintf(`
# standby
port = %d
unix_socket_directories = '%s'
hot_standby = on
wal_receiver_status_interval = 1s
wal_retrieve_retry_interval = 100ms
synchronous_standby_names = ''
`, c.port, c.dataDir)
	if err := c.appendConf(conf); err != nil {
		return nil, err
	}
	if err := c.pgctl(ctx, "start"); err != nil {
		return nil, fmt.Errorf("error starting the standby: %w", err)
	}
	return c, nil
}

// clusterLog creates an empty server log file in logDir that the pg
// binaries' user may append to, and returns its path.
func clusterLog(logDir, name string) (string, error) {
	path := filepath.Join(logDir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return "", fmt.Errorf("error creating %s: %w", path, err)
	}
	_ = f.Close()
	if os.Geteuid() == 0 {
		uid, gid, err := postgresUser()
		if err != nil {
			return "", err
		}
		if err := os.Chown(path, uid, gid); err != nil {
			return "", fmt.Errorf("error giving %s to postgres: %w", path, err)
		}
	}
	return path, nil
}

// waitStreaming waits until pg_stat_replication on primary shows the
// standby streaming, and with sync also as the synchronous standby.
func waitStreaming(ctx context.Context, primary *cluster, sync bool) error {
	conn, err := pgx.Connect(ctx, primary.adminURL())
	if err != nil {
		return fmt.Errorf("error connecting to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(replicationTimeout)
	for {
		var state, syncState string
		err := conn.QueryRow(ctx, `SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1`,
			standbyAppName).Scan(&state, &syncState)
		if err == nil && state == "streaming" && (!sync || syncState == "sync") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("standby not streaming (sync %t) after %s: state %q, sync_state %q, last error %w",
				sync, replicationTimeout, state, syncState, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// syncReplicationOn makes every commit on primary wait until the standby
// has flushed it (synchronous_standby_names '*', synchronous_commit on,
// with ALTER SYSTEM and a reload). Call it after pg_basebackup, so the
// standby does not inherit the setting: once promoted it would wait forever
// for a standby of its own.
func syncReplicationOn(ctx context.Context, primary *cluster) error {
	conn, err := pgx.Connect(ctx, primary.adminURL())
	if err != nil {
		return fmt.Errorf("error connecting to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	for _, sql := range []string{
		`ALTER SYSTEM SET synchronous_standby_names = '*'`,
		`ALTER SYSTEM SET synchronous_commit = 'on'`,
		`SELECT pg_reload_conf()`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("error turning synchronous replication on (%s): %w", sql, err)
		}
	}
	return waitStreaming(ctx, primary, true)
}

// waitReplayed waits until the standby at standbyURL has replayed all the
// WAL the primary at primaryURL has written so far, and returns that
// position.
func waitReplayed(ctx context.Context, primaryURL, standbyURL string) (string, error) {
	pconn, err := pgx.Connect(ctx, primaryURL)
	if err != nil {
		return "", fmt.Errorf("error connecting to the primary: %w", err)
	}
	var target string
	err = pconn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target)
	pconn.Close(context.Background())
	if err != nil {
		return "", fmt.Errorf("error reading the primary's WAL position: %w", err)
	}
	sconn, err := pgx.Connect(ctx, standbyURL)
	if err != nil {
		return "", fmt.Errorf("error connecting to the standby: %w", err)
	}
	defer sconn.Close(context.Background())
	deadline := time.Now().Add(replicationTimeout)
	for {
		var done bool
		var replayed string
		err := sconn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false), coalesce(pg_last_wal_replay_lsn()::text, '')`,
			target).Scan(&done, &replayed)
		if err == nil && done {
			return target, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("standby replayed up to %q, not %s, after %s (last error %w)", replayed, target, replicationTimeout, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// walPosition returns the current WAL insert position of the primary at adminURL.
func walPosition(ctx context.Context, adminURL string) (string, error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", fmt.Errorf("error connecting to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	var lsn string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		return "", fmt.Errorf("error reading the primary's WAL position: %w", err)
	}
	return lsn, nil
}

// walBehind returns how many bytes of WAL up to lsn the standby at standbyURL
// has not replayed (negative: it is ahead).
func walBehind(ctx context.Context, standbyURL, lsn string) (int64, error) {
	conn, err := pgx.Connect(ctx, standbyURL)
	if err != nil {
		return 0, fmt.Errorf("error connecting to the standby: %w", err)
	}
	defer conn.Close(context.Background())
	var behind int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn()), 0)::bigint`, lsn).Scan(&behind); err != nil {
		return 0, fmt.Errorf("error comparing the standby's WAL position with %s: %w", lsn, err)
	}
	return behind, nil
}

// kill stops the cluster the hard way (pg_ctl stop -m immediate): every
// backend dies at once, as with a crashed host, and whatever WAL the
// standby has not received is gone with it.
func (c *cluster) kill(ctx context.Context) error {
	if err := c.pgctl(ctx, "stop", "-m", "immediate"); err != nil {
		return fmt.Errorf("error killing the cluster in %s: %w", c.dataDir, err)
	}
	return nil
}

// promote ends a standby's recovery and makes it a primary (pg_ctl promote
// -w: it returns once the cluster accepts writes).
func (c *cluster) promote(ctx context.Context) error {
	if err := c.pgctl(ctx, "promote"); err != nil {
		return fmt.Errorf("error promoting the standby in %s: %w", c.dataDir, err)
	}
	return nil
}

// addr is the cluster's TCP address on loopback.
func (c *cluster) addr() string { return fmt.Sprintf("127.0.0.1:%d", c.port) }
