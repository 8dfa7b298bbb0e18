# shellcheck shell=bash
# The helpers every script shares (sourced, not executed): set LOG_TAG before sourcing.
# Everything here writes to stderr.

# log MESSAGE...: one line "[LOG_TAG] MESSAGE" on stderr.
log() { printf '[%s] %s\n' "${LOG_TAG:-tally}" "$*" >&2; }

# die MESSAGE...: log "error: MESSAGE" and exit 1.
die() {
  log "error: $*"
  exit 1
}

# port_in_use HOST:PORT: succeeds if something accepts TCP connections there.
port_in_use() { (: <>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; }
