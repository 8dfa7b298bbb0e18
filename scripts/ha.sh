#!/usr/bin/env bash
# A pg_auto_failover formation on loopback, for trying Tally under automatic failover:
#   scripts/ha.sh up [--async]   a monitor and two Postgres nodes, a primary and a secondary;
#                                synchronous: a commit waits for the secondary while it is healthy
#                                (number_sync_standbys 0, synchronous_standby_names '*'); --async:
#                                the secondary takes no part in the quorum (replication-quorum
#                                false), a commit waits for nothing. TALLY_HA_NODES=3: two
#                                secondaries and number_sync_standbys 1 (see docs/reliability.md:
#                                pg_auto_failover 2.0 can leave that shape without a primary)
#   scripts/ha.sh url            the multi-host URL of database tally (target_session_attrs=read-write)
#   scripts/ha.sh status         pg_autoctl show state
#   scripts/ha.sh monitor-url    the URL of the monitor's database (pgautofailover.node lists the nodes)
#   scripts/ha.sh wait [SECONDS] wait until there is a primary and every secondary is back
#   scripts/ha.sh kill-primary   the primary's node dies: SIGKILL to its pg_autoctl keeper and its
#                                postmaster; prints the node's name (the monitor fails over)
#   scripts/ha.sh wait-failover NAME [SECONDS]
#                                wait until a node other than NAME takes writes (primary or
#                                wait_primary on the monitor)
#   scripts/ha.sh start          start the keeper of every node not running (a dead node rejoins)
#   scripts/ha.sh switchover     pg_autoctl perform switchover (a planned one)
#   scripts/ha.sh down           stop every node and the monitor, keep their data
#   scripts/ha.sh destroy        down, then delete the formation
# Installs Debian's postgresql-<major>-auto-failover when pg_autoctl is missing (root, without
# starting any service). Runs everything as user postgres when root. The formation lives in
# .tmp/ha (a symlink to /tmp/tally-ha-<repo hash> when user postgres cannot reach .tmp); ports from
# TALLY_HA_PORT (default 56000: the monitor; 56001, 56002 (, 56003) the nodes). Logs:
# .tmp/ha/<name>.log.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
LOG_TAG=ha
# shellcheck source=lib/pg-common.sh
source "$REPO_ROOT/scripts/lib/pg-common.sh"

HA_LINK="$TMP_DIR/ha"
HA_ALT="/tmp/tally-ha-$(printf '%s' "$REPO_ROOT" | sha256sum | cut -c1-12)"
BASE_PORT="${TALLY_HA_PORT:-56000}"
case "${TALLY_HA_NODES:-2}" in
2) NODES=(node1 node2) ;;
3) NODES=(node1 node2 node3) ;;
*) die "TALLY_HA_NODES must be 2 or 3" ;;
esac

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

# primary_port: the port of the node that takes writes, as the monitor has it (a dead primary still
# reports "primary" until it is back: its goal state says what the monitor made of it).
primary_port() {
  as_pg psql "$(monitor_url)" -X -At -c "SELECT nodeport FROM pgautofailover.node
    WHERE reportedstate = goalstate AND goalstate IN ('primary', 'wait_primary') LIMIT 1" 2>/dev/null || true
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
  wait_healthy 180
  # number_sync_standbys 1 needs two secondaries in the quorum; with one, 0 still makes every
  # commit wait for it while it is healthy.
  local want=0
  [[ $async -eq 0 && ${#NODES[@]} -eq 3 ]] && want=1
  if [[ $(autoctl get formation number-sync-standbys --pgdata "$DIR/monitor" 2>/dev/null) != "$want" ]]; then
    autoctl set formation number-sync-standbys "$want" --pgdata "$DIR/monitor" >>"$(logfile monitor)" 2>&1
  fi
  as_pg psql "$(url postgres)" -X -Atc "SELECT 1 FROM pg_database WHERE datname = 'tally'" | grep -q 1 ||
    as_pg psql "$(url postgres)" -X -Atc "CREATE DATABASE tally" >/dev/null
  log "formation up (${#NODES[@]} nodes, $([[ $async -eq 1 ]] && echo asynchronous || echo "synchronous, number_sync_standbys $want")): $(url)"
}

# url [DB]: the multi-host URL of database DB (default tally) that always reaches the primary.
url() {
  local hosts="" i
  for i in $(seq 1 ${#NODES[@]}); do
    hosts+="${hosts:+,}127.0.0.1:$((BASE_PORT + i))"
  done
  printf 'postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write\n' "$hosts" "${1:-tally}"
}

# kill_primary: the primary's node dies at once, as a machine would: SIGKILL to its keeper (so
# nothing restarts Postgres in place) and to its postmaster. A SIGKILL of the postmaster alone is
# not a failover: the keeper restarts Postgres within a second (docs/reliability.md).
kill_primary() {
  local name run pids
  name="$(as_pg psql "$(monitor_url)" -X -At -c "SELECT nodename FROM pgautofailover.node
    WHERE reportedstate = 'primary' AND goalstate = 'primary'" 2>/dev/null || true)"
  [[ -n $name ]] || die "no primary"
  run="$(pgrep -f "pg_autoctl run --pgdata $DIR/$name\$" || true)"
  [[ -n $run ]] || die "$name's keeper is not running"
  pids="$run $(pgrep -P "$run" | tr '\n' ' ')$(head -1 "$DIR/$name/postmaster.pid" 2>/dev/null || true)"
  log "SIGKILL to $name's keeper and postmaster (pids $pids)"
  # shellcheck disable=SC2086 # a list of pids
  kill -9 $pids 2>/dev/null || true
  printf '%s\n' "$name"
}

# has_new_primary NAME: a node other than NAME takes writes.
has_new_primary() {
  states | awk -v dead="$1" '$1 != dead && ($2 == "primary" || $2 == "wait_primary") { found = 1 } END { exit !found }'
}

start() {
  local name
  run_keeper monitor
  for name in "${NODES[@]}"; do
    [[ -d $DIR/$name ]] && run_keeper "$name"
  done
  return 0
}

down() {
  local name pid pids=()
  # The keepers' (pg_autoctl's pid files, under /tmp/pg_autoctl/<pgdata>) and the postmasters' pids,
  # to wait for below.
  for name in "${NODES[@]}" monitor; do
    for pid in "$(head -1 "/tmp/pg_autoctl$DIR/$name/pg_autoctl.pid" 2>/dev/null || true)" \
      "$(head -1 "$DIR/$name/postmaster.pid" 2>/dev/null || true)"; do
      [[ $pid =~ ^[0-9]+$ ]] && pids+=("$pid")
    done
  done
  for name in "${NODES[@]}" monitor; do
    if [[ -d $DIR/$name ]]; then
      autoctl stop --pgdata "$DIR/$name" >/dev/null 2>&1 || true
    fi
  done
  # What a stop could not reach (a keeper stuck, a postmaster left by a killed keeper).
  pkill -9 -f "pg_autoctl run --pgdata $DIR/" 2>/dev/null || true
  local pid
  for name in "${NODES[@]}" monitor; do
    pid="$(head -1 "$DIR/$name/postmaster.pid" 2>/dev/null || true)"
    if [[ -n $pid ]]; then kill -INT "$pid" 2>/dev/null || true; fi
  done
  # Gone before returning: a keeper still exiting makes the next up refuse to start its node
  # ("pg_autoctl is already running with pid …", which failed a make ha between its two drills).
  local deadline=$((SECONDS + 30))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if ((SECONDS >= deadline)); then
        log "process $pid of the formation still running after 30 s"
        break 2
      fi
      sleep 0.2
    done
  done
  log "formation stopped (data kept in $DIR)"
}

# wait_healthy SECONDS: wait until the formation is healthy. A node that rejoins takes a base backup
# of the primary, and pg_basebackup waits for a spread checkpoint there (up to
# checkpoint_completion_target × checkpoint_timeout, 4.5 min by default, under load): a CHECKPOINT
# on the primary every 5 s while some node is not back makes it immediate, as an operator would.
wait_healthy() {
  local deadline=$((SECONDS + $1)) port
  until healthy; do
    ((SECONDS < deadline)) || die "timed out waiting for a primary and $((${#NODES[@]} - 1)) secondaries (logs in $DIR)"
    if ((SECONDS % 5 == 0)); then
      port="$(primary_port)"
      if [[ -n $port ]]; then
        as_pg psql "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" -X -q -c CHECKPOINT >/dev/null 2>&1 || true
      fi
    fi
    sleep 1
  done
}

case "${1:-}" in
up) up "${2:-}" ;;
wait) wait_healthy "${2:-180}" ;;
url) url ;;
monitor-url) monitor_url ;;
status) autoctl show state --pgdata "$DIR/monitor" ;;
kill-primary) kill_primary ;;
wait-failover)
  [[ -n ${2:-} ]] || die "usage: $0 wait-failover NAME [SECONDS]"
  wait_for "has_new_primary '$2'" "${3:-180}" "a primary other than $2"
  ;;
start) start ;;
switchover) autoctl perform switchover --pgdata "$DIR/monitor" ;;
down) down ;;
destroy)
  down
  rm -rf "$DIR" "$HA_LINK" "/tmp/pg_autoctl$DIR"
  ;;
*) die "usage: $0 up [--async] | url | monitor-url | status | wait [SECONDS] | kill-primary | wait-failover NAME [SECONDS] | start | switchover | down | destroy" ;;
esac
