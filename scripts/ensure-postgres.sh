#!/usr/bin/env bash
# Print exactly one line on stdout: an admin Postgres URL (a superuser that can CREATE
# DATABASE). All logging goes to stderr. Resolution order:
#   (a) $TALLY_ADMIN_DATABASE_URL, if set and it answers;
#   (b) the system Postgres at 127.0.0.1:5432 (skipped when TALLY_PG_SKIP_SYSTEM=1);
#   (c) a private, test-tuned cluster under .tmp/pg, started (or reused) on 127.0.0.1:55432
#       (TALLY_PG_PORT overrides; a busy port moves to the next free one, kept in .tmp/pg.port).
# Idempotent and safe to run concurrently (flock on .tmp/pg.lock).
set -euo pipefail

# fd 3 = the real stdout, reserved for the URL; everything else goes to stderr.
exec 3>&1 1>&2

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
LOG_TAG="ensure-postgres"
# shellcheck source=lib/pg-common.sh
source "$REPO_ROOT/scripts/lib/pg-common.sh"

SYSTEM_URL="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
export PGCONNECT_TIMEOUT="${PGCONNECT_TIMEOUT:-5}"

emit() {
  printf '%s\n' "$1" >&3
  exit 0
}

# Install the Debian postgresql packages without starting the system service.
install_postgres() {
  [[ $EUID -eq 0 ]] || die "PostgreSQL binaries not found and not root: install postgresql (apt-get install postgresql) and retry"
  log "PostgreSQL binaries not found; installing postgresql from apt (this can take a minute)"
  local policy=/usr/sbin/policy-rc.d created_policy=0
  if [[ ! -e $policy ]]; then
    # policy-rc.d exit 101 = "don't start services" for maintainer scripts.
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    created_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update </dev/null >&2
  apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold \
    postgresql postgresql-client </dev/null >&2
  if [[ $created_policy -eq 1 ]]; then
    rm -f "$policy"
    trap - EXIT
  fi
}

# Path to a client tool (psql, pg_isready): PATH first, then the newest server bin dir.
pg_client() {
  local tool="$1" bindir
  if command -v "$tool" >/dev/null 2>&1; then
    command -v "$tool"
    return 0
  fi
  bindir="$(pg_bindir)"
  if [[ -z $bindir ]]; then
    install_postgres
    bindir="$(pg_bindir)"
  fi
  [[ -n $bindir && -x $bindir/$tool ]] || die "cannot find $tool"
  printf '%s\n' "$bindir/$tool"
}

# Succeeds if URL $1 accepts connections and answers "select 1".
answers() {
  local out
  out="$("$PSQL" "$1" -X -At -v ON_ERROR_STOP=1 -c 'select 1' 2>/dev/null </dev/null)" || return 1
  [[ $out == 1 ]]
}

PSQL="$(pg_client psql)"
PG_ISREADY="$(pg_client pg_isready)"

# (a) Explicit admin URL.
if [[ -n ${TALLY_ADMIN_DATABASE_URL:-} ]]; then
  if answers "$TALLY_ADMIN_DATABASE_URL"; then
    can="$("$PSQL" "$TALLY_ADMIN_DATABASE_URL" -X -At -c \
      'select rolsuper or rolcreatedb from pg_roles where rolname = current_user' </dev/null 2>/dev/null || true)"
    [[ $can == t ]] || log "warning: TALLY_ADMIN_DATABASE_URL's role may not be able to CREATE DATABASE"
    log "using TALLY_ADMIN_DATABASE_URL"
    emit "$TALLY_ADMIN_DATABASE_URL"
  fi
  log "TALLY_ADMIN_DATABASE_URL is set but does not answer; trying the next option"
fi

# (b) System Postgres on the standard port.
if [[ ${TALLY_PG_SKIP_SYSTEM:-0} != 1 ]]; then
  if "$PG_ISREADY" -q -h 127.0.0.1 -p 5432 -t 3 && answers "$SYSTEM_URL"; then
    log "using the system Postgres at 127.0.0.1:5432"
    emit "$SYSTEM_URL"
  fi
  log "no usable Postgres at 127.0.0.1:5432; using a private cluster"
else
  log "TALLY_PG_SKIP_SYSTEM=1: skipping the system Postgres"
fi

# (c) Private cluster. Everything below runs under the lock.
mkdir -p "$TMP_DIR"
exec 9>"$LOCK_FILE"
if ! flock -w 300 9; then
  die "timed out waiting for $LOCK_FILE"
fi

private_url() { printf 'postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable' "$1"; }

# Make sure OS user postgres exists (only needed, and only possible, as root).
ensure_pg_user() {
  [[ $EUID -eq 0 ]] || return 0
  id -u postgres >/dev/null 2>&1 && return 0
  log "creating system user postgres"
  if getent group postgres >/dev/null; then
    useradd --system --gid postgres --home-dir /var/lib/postgresql --shell /bin/bash postgres
  else
    useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/bash postgres
  fi
}

# Create a base dir owned by the cluster owner, mode 0700.
make_owned_dir() {
  if [[ $EUID -eq 0 ]]; then
    install -d -m 0700 -o postgres -g "$(id -gn postgres)" "$1"
  else
    install -d -m 0700 "$1"
  fi
}

# Can the cluster owner reach (and the socket path fit under) base dir $1?
base_usable() {
  local base="$1"
  # Unix socket paths are limited to ~107 bytes: "<base>/data/.s.PGSQL.NNNNN".
  ((${#base} + 24 <= 100)) || return 1
  [[ $EUID -ne 0 ]] && return 0
  runuser -u postgres -- test -x "$(dirname "$base")" 2>/dev/null
}

# Decide and create the base dir: .tmp/pg if postgres can reach it, else a /tmp dir
# symlinked from .tmp/pg. Prints the real path.
resolve_base() {
  local base
  base="$(pg_existing_base)"
  if [[ -n $base ]] && base_usable "$base"; then
    printf '%s\n' "$base"
    return 0
  fi
  if [[ -n $base ]]; then
    log "existing $base is not usable by user postgres; recreating it elsewhere"
    rm -rf -- "$base"
  fi
  # A dangling or unusable link/dir is replaced.
  [[ -L $PG_LINK ]] && rm -f -- "$PG_LINK"
  if base_usable "$PG_LINK"; then
    make_owned_dir "$PG_LINK"
    printf '%s\n' "$PG_LINK"
    return 0
  fi
  log "user postgres cannot reach $TMP_DIR (or the path is too long); using $PG_ALT_BASE"
  if [[ -L $PG_ALT_BASE ]] || { [[ -e $PG_ALT_BASE ]] && [[ ! -d $PG_ALT_BASE ]]; }; then
    die "$PG_ALT_BASE exists and is not a directory; remove it"
  fi
  make_owned_dir "$PG_ALT_BASE" # (re)applies owner and mode if it already exists
  rm -rf -- "$PG_LINK"
  ln -s "$PG_ALT_BASE" "$PG_LINK"
  printf '%s\n' "$PG_ALT_BASE"
}

ensure_pg_user
BASE="$(resolve_base)"
DATA="$BASE/data"
PG_LOG="$BASE/postgres.log"

# Already running? Reuse it.
if port="$(pg_running_port "$DATA")"; then
  if "$PG_ISREADY" -q -h 127.0.0.1 -p "$port" -t 30 && answers "$(private_url "$port")"; then
    printf '%s\n' "$port" >"$PORT_FILE"
    log "reusing the private cluster in $DATA on port $port"
    emit "$(private_url "$port")"
  fi
  die "private cluster in $DATA is running on port $port but does not answer; see $PG_LOG (or run scripts/stop-postgres.sh)"
fi

# Pick binaries: the version the data dir was made with, else the newest (installing if needed).
BINDIR=""
if [[ -f $DATA/PG_VERSION ]]; then
  BINDIR="$(pg_bindir "$(cat "$DATA/PG_VERSION")")"
  if [[ -z $BINDIR ]]; then
    log "no binaries for PostgreSQL $(cat "$DATA/PG_VERSION") (the data dir's version); re-initialising"
    rm -rf -- "$DATA"
  fi
fi
if [[ -z $BINDIR ]]; then
  BINDIR="$(pg_bindir)"
  if [[ -z $BINDIR ]]; then
    install_postgres
    ensure_pg_user
    BINDIR="$(pg_bindir)"
    [[ -n $BINDIR ]] || die "postgresql installed but initdb/pg_ctl not found under /usr/lib/postgresql/*/bin"
  fi
fi

# initdb once, with trust auth and test-friendly settings.
if [[ ! -f $DATA/PG_VERSION ]]; then
  rm -rf -- "$DATA"
  locale_opt=(--locale=C)
  # (here-string, not a pipe: grep -q would SIGPIPE locale under pipefail)
  if grep -qiE '^c\.utf-?8$' <<<"$(locale -a 2>/dev/null || true)"; then locale_opt=(--locale=C.UTF-8); fi
  log "initialising a private cluster in $DATA ($BINDIR)"
  as_pg "$BINDIR/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 "${locale_opt[@]}" --no-instructions >&2
  cat >>"$DATA/postgresql.conf" <<EOF

# --- Tally private test cluster (scripts/ensure-postgres.sh) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DATA'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 300
shared_buffers = 256MB
EOF
fi

# Port: 55432 (or TALLY_PG_PORT); if busy it is not ours (ours isn't running), so take the
# next free one. The chosen port is recorded in .tmp/pg.port.
pick_port() {
  local p="$PG_DEFAULT_PORT" i
  for ((i = 0; i < 200; i++)); do
    if ! port_in_use "127.0.0.1:$p"; then
      printf '%s\n' "$p"
      return 0
    fi
    log "port $p is in use by something else; trying $((p + 1))"
    p=$((p + 1))
  done
  die "no free port found"
}

started=""
for attempt in 1 2 3; do
  port="$(pick_port)"
  log "starting the private cluster on 127.0.0.1:$port (log: $PG_LOG)"
  if as_pg "$BINDIR/pg_ctl" -D "$DATA" -l "$PG_LOG" -o "-p $port" -w -t 90 start >&2; then
    started="$port"
    break
  fi
  log "start attempt $attempt failed; last log lines:"
  tail -n 5 "$PG_LOG" >&2 || true
  # Stale pid file with a recycled pid: postgres refuses to start; clear it if nobody owns it.
  if [[ -f $DATA/postmaster.pid ]] && ! pg_running_port "$DATA" >/dev/null; then
    rm -f -- "$DATA/postmaster.pid"
  fi
done
[[ -n $started ]] || die "could not start the private cluster; see $PG_LOG"

printf '%s\n' "$started" >"$PORT_FILE"
url="$(private_url "$started")"
answers "$url" || die "private cluster started on port $started but does not answer; see $PG_LOG"
log "private cluster ready on 127.0.0.1:$started"
emit "$url"
