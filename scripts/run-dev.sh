#!/usr/bin/env bash
# `make run`: a local dev stack.
#   Postgres (scripts/ensure-postgres.sh) → database "tally" → migrate up → a fresh dev API key
#   → cmd/stripesim on 127.0.0.1:12111 (background) → cmd/server on 127.0.0.1:8080 (foreground),
#   its metrics on 127.0.0.1:9464. The simulator posts its events to the server's
#   /v1/stripe/webhooks, signed with a webhook secret made for this run that the server checks:
#   refunds and disputes made in the simulator reach the ledger.
# Binaries are built into .tmp/bin (not `go run`) so signals reach the real processes.
# Ctrl-C (or SIGTERM to this script) stops the server gracefully, then the simulator.
# Env: TALLY_PERIOD (default hour), STRIPESIM_FLAGS (extra stripesim flags, word-split);
#   TALLY_DEV_HTTP_ADDR, TALLY_DEV_SIM_ADDR, TALLY_DEV_METRICS_ADDR, TALLY_DEV_DB and
#   TALLY_DEV_KEY_FILE move the stack (defaults 127.0.0.1:8080, 127.0.0.1:12111, 127.0.0.1:9464
#   or off, database tally, .tmp/dev-api-key): the README test runs a second stack beside yours
#   with them.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$REPO_ROOT"
BIN="$REPO_ROOT/.tmp/bin"
GO="${GO:-go}"

HTTP_ADDR="${TALLY_DEV_HTTP_ADDR:-127.0.0.1:8080}"
SIM_ADDR="${TALLY_DEV_SIM_ADDR:-127.0.0.1:12111}"
METRICS_ADDR="${TALLY_DEV_METRICS_ADDR:-127.0.0.1:9464}"
DB_NAME="${TALLY_DEV_DB:-tally}"
KEY_FILE="${TALLY_DEV_KEY_FILE:-$REPO_ROOT/.tmp/dev-api-key}"
SCOPES="usage:write,customers:write,billing:read,admin"

LOG_TAG=run-dev
# shellcheck source=lib/common.sh
source "$REPO_ROOT/scripts/lib/common.sh"

# Fail early, before building, if the ports are taken (e.g. a previous run still alive).
port_in_use "$HTTP_ADDR" && die "$HTTP_ADDR is already in use (another tally server?)"
port_in_use "$SIM_ADDR" && die "$SIM_ADDR is already in use (a leftover stripesim?)"
if [[ $METRICS_ADDR != off ]] && port_in_use "$METRICS_ADDR"; then
  die "$METRICS_ADDR is already in use (another tally server?); set TALLY_DEV_METRICS_ADDR to another address, or off"
fi

admin_url="$(bash scripts/ensure-postgres.sh)"
DATABASE_URL="$(bash scripts/ensure-db.sh "$DB_NAME" "$admin_url")"
export DATABASE_URL

log "building cmd/{server,migrate,billingctl,stripesim} into .tmp/bin"
mkdir -p "$BIN"
"$GO" build -o "$BIN/" ./cmd/server ./cmd/migrate ./cmd/billingctl ./cmd/stripesim

log "migrating $DATABASE_URL"
"$BIN/migrate" up >&2

log "creating a dev API key"
key="$("$BIN/billingctl" apikey create --name dev --scopes "$SCOPES")"
key="${key//[[:space:]]/}"
[[ -n $key ]] || die "billingctl apikey create printed no key"
mkdir -p "$(dirname "$KEY_FILE")"
(umask 077 && printf '%s\n' "$key" >"$KEY_FILE")
key_file_shown="${KEY_FILE#"$REPO_ROOT"/}"

export TALLY_HTTP_ADDR="$HTTP_ADDR"
export TALLY_METRICS_ADDR="$METRICS_ADDR"
export STRIPE_API_KEY="sk_test_tally_dev"
export STRIPE_API_BASE="http://$SIM_ADDR"
# One webhook secret per run, the simulator signing with what the server checks.
STRIPE_WEBHOOK_SECRET="whsec_$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
export STRIPE_WEBHOOK_SECRET
export STRIPESIM_WEBHOOK_SECRET="$STRIPE_WEBHOOK_SECRET"
export STRIPESIM_WEBHOOK_URL="http://$HTTP_ADDR/v1/stripe/webhooks"
export TALLY_PERIOD="${TALLY_PERIOD:-hour}"
export TALLY_WEBHOOKS_ALLOW_CIDRS="${TALLY_WEBHOOKS_ALLOW_CIDRS:-127.0.0.0/8,::1/128}" # webhooks (http:// too) to this host
if [[ $METRICS_ADDR == off ]]; then metrics_shown="off"; else metrics_shown="http://$METRICS_ADDR/metrics"; fi

cat <<EOF

  ┌──────────────────────────── Tally dev stack ────────────────────────────
  │ API          http://$HTTP_ADDR
  │ Stripe sim   http://$SIM_ADDR
  │   webhooks → $STRIPESIM_WEBHOOK_URL
  │   signed with $STRIPE_WEBHOOK_SECRET
  │ Metrics      $metrics_shown
  │ Database     $DATABASE_URL
  │ Period       $TALLY_PERIOD
  │
  │ Dev API key  ($SCOPES)
  │   $key
  │ (also saved in $key_file_shown)
  │
  │ Paste into another shell:
  │   export TALLY_KEY=$(printf '%q' "$key")
  │   curl -s -H "Authorization: Bearer \$TALLY_KEY" http://$HTTP_ADDR/v1/charges
  │
  │ Ctrl-C stops the server and the simulator.
  └──────────────────────────────────────────────────────────────────────────

EOF

sim_pid=""
srv_pid=""
# On exit (normal, error or signal): stop whatever is still running, server first.
# shellcheck disable=SC2317 # invoked via trap
cleanup() {
  local pid
  for pid in "$srv_pid" "$sim_pid"; do
    [[ -n $pid ]] || continue
    kill -0 "$pid" 2>/dev/null || continue
    kill -TERM "$pid" 2>/dev/null || true
    for _ in {1..50}; do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

log "starting stripesim on $SIM_ADDR"
# shellcheck disable=SC2086 # STRIPESIM_FLAGS is intentionally word-split
"$BIN/stripesim" --addr "$SIM_ADDR" ${STRIPESIM_FLAGS:-} &
sim_pid=$!
sim_up=0
for _ in {1..100}; do
  sleep 0.1
  kill -0 "$sim_pid" 2>/dev/null || die "stripesim exited during startup"
  if port_in_use "$SIM_ADDR"; then
    sim_up=1
    break
  fi
done
[[ $sim_up -eq 1 ]] || die "stripesim did not listen on $SIM_ADDR within 10s"
# Still alive shortly after the port answered (i.e. it's our listener, not a late bind failure).
sleep 0.3
kill -0 "$sim_pid" 2>/dev/null || die "stripesim exited during startup"

log "starting server on $HTTP_ADDR (TALLY_PERIOD=$TALLY_PERIOD)"
"$BIN/server" &
srv_pid=$!

# Background jobs of a non-interactive shell start with SIGINT ignored (Go's signal.Notify
# re-enables it). A terminal Ctrl-C reaches the server directly; SIGTERM is forwarded too,
# so the server always gets a signal it can handle gracefully.
stopping=0
# shellcheck disable=SC2317 # invoked via trap
forward() {
  stopping=1
  kill -TERM "$srv_pid" 2>/dev/null || true
}
trap forward INT TERM HUP

# `wait` returns early when a trapped signal arrives; keep waiting until the server is gone.
status=0
while :; do
  if wait "$srv_pid"; then status=0; else status=$?; fi
  kill -0 "$srv_pid" 2>/dev/null || break
done
srv_pid=""
if [[ $stopping -eq 1 ]]; then
  log "stopped"
  exit 0
fi
log "server exited with status $status"
exit "$status"
