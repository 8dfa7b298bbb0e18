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

# apt_install PACKAGE...: apt-get install Debian's PACKAGEs quietly (an apt-get update first only
# when the install fails), with no service of theirs started: policy-rc.d answers 101 to their
# maintainer scripts while they install, unless one is already in place.
apt_install() {
  local policy=/usr/sbin/policy-rc.d created=0 status=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    created=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null 2>&1 ||
    { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null; } ||
    status=$?
  if [[ $created -eq 1 ]]; then
    rm -f "$policy"
  fi
  return "$status"
}
