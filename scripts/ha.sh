#!/usr/bin/env bash
# A pg_auto_failover formation on loopback, for trying Tally under automatic failover:
#   scripts/ha.sh up [--async]   a monitor and three Postgres nodes (a primary, two secondaries);
#                                synchronous: number_sync_standbys 1, a commit waits for one
#                                secondary; --async: the secondaries take no part in the quorum
#                                (replication-quorum false), a commit waits for none
#   scripts/ha.sh url            the multi-host URL of database tally (target_session_attrs=read-write)
#   scripts/ha.sh status         pg_autoctl show state
#   scripts/ha.sh wait [SECONDS] wait until there is a primary and both secondaries are back
#   scripts/ha.sh kill-primary   SIGKILL the primary's postmaster (the monitor fails over)
#   scripts/ha.sh switchover     pg_autoctl perform switchover (a planned one)
#   scripts/ha.sh down           stop every node and the monitor, keep their data
#   scripts/ha.sh destroy        down, then delete the formation
# Installs Debian's postgresql-<major>-auto-failover when pg_autoctl is missing (root, without
# starting any service). Runs everything as user postgres when root. The formation lives in
# .tmp/ha (a symlink to /tmp/tally-ha-<repo hash> when user postgres cannot reach .tmp); ports from
# TALLY_HA_PORT (default 56000: the monitor; 56001-56003 the nodes). Logs: .tmp/ha/<name>.log.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
LOG_TAG=ha
# shellcheck source=lib/pg-common.sh
source "$REPO_ROOT/scripts/lib/pg-common.sh"

HA_LINK="$TMP_DIR/ha"
HA_ALT="/tmp/tally-ha-$(printf '%s' "$REPO_ROOT" | sha256sum | cut -c1-12)"
BASE_PORT="${TALLY_HA_PORT:-56000}"
NODES=(node1 node2 node3)

# The formation's directory, created on first use where user postgres can write.
ha_dir() {
  if [[ -L $HA_LINK || -d $HA_LINK ]]; then
    readlink -f "$HA_LINK"
    return 0
  fi
  mkdir -p "$TMP_DIR"
  local dir="$HA_LINK"
  if [[ $EUID -eq 0 ]] && ! runuser -u postgres -- test -x "$TMP_DIR"; then
    dir="$HA_ALT"
    ln -sfn "$dir" "$HA_LINK"
  fi
  mkdir -p "$dir"
  [[ $EUID -eq 0 ]] && chown postgres: "$dir"
  printf '%s\n' "$dir"
}

DIR="$(ha_dir)"

# logfile NAME: NAME's log in the formation, created by its owner (the keeper appends to it).
logfile() {
  as_pg touch "$DIR/$1.log"
  printf '%s\n' "$DIR/$1.log"
}

# autoctl ARGS...: pg_autoctl as the formation's owner, its configuration kept in the formation.
autoctl() { as_pg env XDG_CONFIG_HOME="$DIR/config" XDG_DATA_HOME="$DIR/data" pg_autoctl "$@"; }

monitor_url() { printf 'postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable\n' "$BASE_PORT"; }

ensure_pg_autoctl() {
  command -v pg_autoctl >/dev/null && return 0
  [[ $EUID -eq 0 ]] || die "pg_autoctl not found: install postgresql-<major>-auto-failover and retry"
  local bindir major
  bindir="$(pg_bindir "")"
  [[ -n $bindir ]] || die "no PostgreSQL binaries: run scripts/ensure-postgres.sh first"
  major="$(basename "$(dirname "$bindir")")"
  log "installing postgresql-$major-auto-failover (Debian package)"
  apt_install "postgresql-$major-auto-failover"
  command -v pg_autoctl >/dev/null || die "pg_autoctl still not found after installing"
}

# run_keeper NAME: start pg_autoctl run for NAME's data directory in the background, unless its
# keeper is already running.
run_keeper() {
  local name="$1"
  if autoctl status --pgdata "$DIR/$name" >/dev/null 2>&1; then
    return 0
  fi
  as_pg bash -c "nohup env XDG_CONFIG_HOME='$DIR/config' XDG_DATA_HOME='$DIR/data' pg_autoctl run --pgdata '$DIR/$name' >>'$(logfile "$name")' 2>&1 &"
}

# wait_for CONDITION_CMD SECONDS WHAT
wait_for() {
  local deadline=$((SECONDS + $2))
  until eval "$1" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out waiting for $3 (logs in $DIR)"
    sleep 1
  done
}

# states: the nodes' reported states, one "name state" per line.
states() {
  as_pg psql "$(monitor_url)" -X -At -F ' ' -c \
    "SELECT nodename, reportedstate FROM pgautofailover.node ORDER BY nodeid" 2>/dev/null
}

healthy() {
  local s
  s="$(states)"
  [[ $(grep -c ' primary$' <<<"$s") -eq 1 && $(grep -c ' secondary$' <<<"$s") -eq $((${#NODES[@]} - 1)) ]]
}

up() {
  local async=0
  [[ ${1:-} == --async ]] && async=1
  ensure_pg_autoctl
  local pgctl
  pgctl="$(pg_bindir "")/pg_ctl"
  if [[ ! -d $DIR/monitor ]]; then
    log "creating the monitor on 127.0.0.1:$BASE_PORT"
    autoctl create monitor --pgctl "$pgctl" --pgdata "$DIR/monitor" --pgport "$BASE_PORT" \
      --hostname 127.0.0.1 --auth trust --no-ssl >>"$(logfile monitor)" 2>&1
  fi
  run_keeper monitor
  wait_for "as_pg psql '$(monitor_url)' -X -Atc 'select 1'" 60 "the monitor"
  local i=0 name
  for name in "${NODES[@]}"; do
    i=$((i + 1))
    if [[ ! -d $DIR/$name ]]; then
      log "creating $name on 127.0.0.1:$((BASE_PORT + i))"
      autoctl create postgres --pgctl "$pgctl" --pgdata "$DIR/$name" --pgport "$((BASE_PORT + i))" \
        --hostname 127.0.0.1 --name "$name" --auth trust --no-ssl --monitor "$(monitor_url)" \
        --replication-quorum "$([[ $async -eq 1 && $i -gt 1 ]] && echo false || echo true)" >>"$(logfile "$name")" 2>&1
    fi
    run_keeper "$name"
    # One at a time: a node joins as secondary once the one before it is up.
    wait_for "[[ \$(states | grep -c -E ' (single|primary|wait_primary|secondary)\$') -ge $i ]]" 180 "$name"
  done
  wait_for healthy 180 "a primary and $((${#NODES[@]} - 1)) secondaries"
  local want=0
  [[ $async -eq 0 ]] && want=1
  if [[ $(autoctl get formation number-sync-standbys --pgdata "$DIR/monitor" 2>/dev/null) != "$want" ]]; then
    autoctl set formation number-sync-standbys "$want" --pgdata "$DIR/monitor" >>"$(logfile monitor)" 2>&1
  fi
  as_pg psql "$(url postgres)" -X -Atc "SELECT 1 FROM pg_database WHERE datname = 'tally'" | grep -q 1 ||
    as_pg psql "$(url postgres)" -X -Atc "CREATE DATABASE tally" >/dev/null
  log "formation up ($([[ $async -eq 1 ]] && echo asynchronous || echo 'synchronous, number_sync_standbys 1')): $(url)"
}

# url [DB]: the multi-host URL of database DB (default tally) that always reaches the primary.
url() {
  local hosts="" i
  for i in $(seq 1 ${#NODES[@]}); do
    hosts+="${hosts:+,}127.0.0.1:$((BASE_PORT + i))"
  done
  printf 'postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write\n' "$hosts" "${1:-tally}"
}

kill_primary() {
  local name
  name="$(states | awk '$2 == "primary" { print $1 }')"
  [[ -n $name ]] || die "no primary"
  local pid
  pid="$(head -1 "$DIR/$name/postmaster.pid")"
  log "SIGKILL to $name's postmaster (pid $pid)"
  kill -9 "$pid"
}

down() {
  local name
  for name in "${NODES[@]}" monitor; do
    if [[ -d $DIR/$name ]]; then
      autoctl stop --pgdata "$DIR/$name" >/dev/null 2>&1 || true
    fi
  done
  log "formation stopped (data kept in $DIR)"
}

case "${1:-}" in
up) up "${2:-}" ;;
wait) wait_for healthy "${2:-180}" "a primary and $((${#NODES[@]} - 1)) secondaries" ;;
url) url ;;
status) autoctl show state --pgdata "$DIR/monitor" ;;
kill-primary) kill_primary ;;
switchover) autoctl perform switchover --pgdata "$DIR/monitor" ;;
down) down ;;
destroy)
  down
  rm -rf "$DIR" "$HA_LINK"
  ;;
*) die "usage: $0 up [--async] | url | status | wait [SECONDS] | kill-primary | switchover | down | destroy" ;;
esac
