#!/usr/bin/env bash
# Stop the private Postgres cluster started by scripts/ensure-postgres.sh (never the system one).
# Usage: scripts/stop-postgres.sh [--purge]   (--purge also deletes its data and .tmp/pg*)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
LOG_TAG="stop-postgres"
# shellcheck source=lib/pg-common.sh
source "$REPO_ROOT/scripts/lib/pg-common.sh"

purge=0
case "${1:-}" in
  "") ;;
  --purge) purge=1 ;;
  *) die "usage: $0 [--purge]" ;;
esac

[[ -d $TMP_DIR ]] || {
  log "no private cluster (no $TMP_DIR)"
  exit 0
}
exec 9>"$LOCK_FILE"
flock -w 300 9 || die "timed out waiting for $LOCK_FILE"

BASE="$(pg_existing_base)"
if [[ -z $BASE ]]; then
  log "no private cluster in $PG_LINK"
elif port="$(pg_running_port "$BASE/data")"; then
  BINDIR="$(pg_bindir "$(cat "$BASE/data/PG_VERSION")")"
  [[ -n $BINDIR ]] || BINDIR="$(pg_bindir)"
  [[ -n $BINDIR ]] || die "pg_ctl not found"
  log "stopping the private cluster in $BASE/data (port $port)"
  as_pg "$BINDIR/pg_ctl" -D "$BASE/data" -m fast -w -t 60 stop >&2
else
  log "the private cluster in $BASE/data is not running"
fi

if [[ $purge -eq 1 ]]; then
  log "purging the private cluster's files"
  [[ -n $BASE ]] && rm -rf -- "$BASE"
  rm -rf -- "$PG_LINK" "$PORT_FILE"
fi
