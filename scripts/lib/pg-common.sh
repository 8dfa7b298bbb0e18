# shellcheck shell=bash disable=SC2034 # (its variables are used by the scripts that source it)
# Shared helpers for ensure-postgres.sh / stop-postgres.sh (sourced, not executed).
# Expects REPO_ROOT to be set by the caller. Everything here logs to stderr.

: "${REPO_ROOT:?REPO_ROOT must be set before sourcing pg-common.sh}"

TMP_DIR="$REPO_ROOT/.tmp"
PG_LINK="$TMP_DIR/pg"        # private cluster base: a real dir, or a symlink to PG_ALT_BASE
PORT_FILE="$TMP_DIR/pg.port" # port the private cluster was last started on
LOCK_FILE="$TMP_DIR/pg.lock" # flock for start/stop of the private cluster
PG_DEFAULT_PORT="${TALLY_PG_PORT:-55432}"
# Fallback base when user postgres cannot reach .tmp (e.g. repo under /root): short, per-repo.
PG_ALT_BASE="/tmp/tally-pg-$(printf '%s' "$REPO_ROOT" | sha256sum | cut -c1-12)"

LOG_TAG="${LOG_TAG:-pg}"
# shellcheck source=common.sh
source "$REPO_ROOT/scripts/lib/common.sh"

# Run a command as the cluster owner: user postgres when we are root (Postgres refuses
# to run as root), otherwise as ourselves. cd / so an unreadable cwd can't break initdb.
# fds 3 (our saved stdout) and 9 (the lock) are closed so a daemonized postmaster never
# holds a caller's pipe or our flock open.
as_pg() {
  if [[ $EUID -eq 0 ]]; then
    (cd / && runuser -u postgres -- "$@") 3>&- 9>&-
  else
    (cd / && "$@") 3>&- 9>&-
  fi
}

# Newest PostgreSQL server bin dir (contains initdb + pg_ctl), or the one for version $1.
pg_bindir() {
  local want="${1:-}" d
  if [[ -n $want ]]; then
    d="/usr/lib/postgresql/$want/bin"
    [[ -x $d/initdb && -x $d/pg_ctl ]] && printf '%s\n' "$d"
    return 0
  fi
  local dirs=()
  mapfile -t dirs < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r)
  for d in "${dirs[@]}"; do
    if [[ -x $d/initdb && -x $d/pg_ctl ]]; then
      printf '%s\n' "$d"
      return 0
    fi
  done
  return 0
}

# Resolve the existing private cluster base dir (following the symlink); empty if none.
pg_existing_base() {
  if [[ -L $PG_LINK ]]; then
    local target
    target="$(readlink -f -- "$PG_LINK" || true)"
    [[ -n $target && -d $target ]] && printf '%s\n' "$target"
  elif [[ -d $PG_LINK ]]; then
    printf '%s\n' "$PG_LINK"
  fi
  return 0
}

# If the postmaster for data dir $1 is alive, print its port and succeed.
pg_running_port() {
  local pidfile="$1/postmaster.pid" pid port comm
  [[ -f $pidfile ]] || return 1
  pid="$(sed -n 1p "$pidfile")"
  port="$(sed -n 4p "$pidfile")"
  [[ $pid =~ ^[0-9]+$ && $port =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # Guard against a stale pid file whose pid was recycled by another process.
  comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
  [[ $comm == postgres* || $comm == postmaster* ]] || return 1
  printf '%s\n' "$port"
}

