#!/usr/bin/env bash
# Install the dev tools into $(go env GOPATH)/bin if missing or at the wrong version:
#   scripts/ensure-tools.sh        the test tools (stripe-mock, helm, oapi-codegen, promtool, chromium,
#                                  pdftotext, pgbouncer)
#   scripts/ensure-tools.sh lint   the linters (golangci-lint, shellcheck)
# Idempotent; prints nothing on stdout (logs to stderr). Callers use e.g.
#   "$(go env GOPATH)/bin/stripe-mock"
set -euo pipefail

exec 1>&2 # nothing on stdout

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
GO="${GO:-go}"
LOG_TAG=ensure-tools
# shellcheck source=lib/common.sh
source "$REPO_ROOT/scripts/lib/common.sh"

gopath="$("$GO" env GOPATH)"
bindir="${gopath%%:*}/bin" # first GOPATH entry, as go install uses
mkdir -p "$bindir" "$REPO_ROOT/.tmp"

# Serialize concurrent runs (parallel make, several checkouts sharing GOPATH are still fine:
# go install writes the binary atomically).
exec 9>"$REPO_ROOT/.tmp/tools.lock"
flock -w 600 9

# install_tool NAME MODULE_PATH VERSION: go install MODULE_PATH@VERSION unless the binary
# NAME already exists and was built from exactly that module version.
install_tool() {
  local name="$1" pkg="$2" version="$3" bin="$bindir/$1" have=""
  if [[ -x $bin ]]; then
    have="$("$GO" version -m "$bin" 2>/dev/null | awk '$1 == "mod" { print $3; exit }' || true)"
  fi
  if [[ $have == "$version" ]]; then
    return 0
  fi
  log "installing $name ($pkg@$version) into $bindir${have:+ (found $have)}"
  # Outside the repo and with GOFLAGS cleared so the project's module settings can't interfere.
  (cd / && GOBIN="$bindir" GOFLAGS='' "$GO" install "$pkg@$version")
}


# promtool (Prometheus' checker of metrics and rules) from Debian's prometheus
# package: extracted from the .deb into $bindir rather than installed, so no
# Prometheus server is set up or started.
ensure_promtool() {
  if command -v promtool >/dev/null || [[ -x $bindir/promtool ]]; then
    return 0
  fi
  log "installing promtool (Debian package prometheus) into $bindir"
  local work
  work="$(mktemp -d)"
  (
    cd "$work"
    apt-get download prometheus >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get download prometheus >/dev/null; }
    dpkg-deb -x prometheus_*.deb root
    install -m 0755 root/usr/bin/promtool "$bindir/promtool"
  )
  rm -rf "$work"
}

# ensure_deb NAME WHY [COMMAND]: apt-get install Debian's package NAME unless COMMAND (default:
# NAME) exists. Chromium runs the browser tests headless (the River UI, a statement printed to
# PDF), pdftotext (poppler-utils) reads that PDF back; shellcheck lints.
ensure_deb() {
  local name="$1" why="$2" cmd="${3:-$1}"
  if command -v "$cmd" >/dev/null; then
    return 0
  fi
  log "installing $name (Debian package) for $why"
  apt_install "$name"
}

case "${1:-test}" in
test)
  install_tool stripe-mock github.com/stripe/stripe-mock v0.203.0
  install_tool helm helm.sh/helm/v3/cmd/helm v3.22.0
  # oapi-codegen generates the client apispec's TestClient builds: a tool, kept out of go.mod.
  install_tool oapi-codegen github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen v2.8.2
  ensure_promtool
  ensure_deb chromium "the browser tests"
  ensure_deb poppler-utils "the statement's PDF test" pdftotext
  # pgbouncer: the tests run Tally's pools through it in transaction mode, starting their own on
  # loopback ports as the postgres user (apt_install starts no service of the package's).
  ensure_deb pgbouncer "the pooler tests" /usr/sbin/pgbouncer
  ;;
lint)
  install_tool golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint v2.15.0
  ensure_deb shellcheck "make lint"
  ;;
*) die "usage: $0 [test|lint]" ;;
esac
