#!/usr/bin/env bash
# Usage: scripts/ensure-db.sh NAME [ADMIN_URL]
# Create database NAME if it does not exist (race-safe) and print its URL (one line on stdout).
# ADMIN_URL defaults to the output of scripts/ensure-postgres.sh.
set -euo pipefail

exec 3>&1 1>&2 # fd 3 = real stdout, for the URL only

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
LOG_TAG=ensure-db
# shellcheck source=lib/common.sh
source "$REPO_ROOT/scripts/lib/common.sh"

[[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 NAME [ADMIN_URL]"
name="$1"
# Plain identifiers only: safe unquoted in a URL path and easy to type in psql.
[[ $name =~ ^[A-Za-z_][A-Za-z0-9_-]{0,62}$ ]] || die "invalid database name: $name"

admin_url="${2:-}"
if [[ -z $admin_url ]]; then
  admin_url="$(bash "$REPO_ROOT/scripts/ensure-postgres.sh")"
fi

PSQL="$(command -v psql || true)"
if [[ -z $PSQL ]]; then
  PSQL="$(printf '%s\n' /usr/lib/postgresql/*/bin/psql | sort -V | tail -n 1)"
  [[ -x $PSQL ]] || die "psql not found (run scripts/ensure-postgres.sh first)"
fi
export PGCONNECT_TIMEOUT="${PGCONNECT_TIMEOUT:-5}"

exists() {
  local out
  out="$("$PSQL" "$admin_url" -X -At -v ON_ERROR_STOP=1 -v name="$name" 2>/dev/null <<'SQL'
SELECT 1 FROM pg_database WHERE datname = :'name';
SQL
)" || die "cannot query pg_database via the admin URL"
  [[ $out == 1 ]]
}

if ! exists; then
  log "creating database $name"
  # A concurrent creator may win the race (duplicate_database / unique violation):
  # ignore the error here and judge by the re-check below.
  err="$("$PSQL" "$admin_url" -X -q -v ON_ERROR_STOP=1 -v name="$name" 2>&1 >/dev/null <<'SQL'
CREATE DATABASE :"name";
SQL
)" || true
  exists || die "could not create database $name: $err"
fi

# Same server and credentials as the admin URL, with the database name swapped in.
if [[ $admin_url =~ ^(postgres(ql)?://[^/?]*)(/[^?]*)?(\?.*)?$ ]]; then
  printf '%s/%s%s\n' "${BASH_REMATCH[1]}" "$name" "${BASH_REMATCH[4]}" >&3
elif [[ $admin_url == *dbname=* ]]; then
  # keyword/value DSN
  printf '%s\n' "$(sed -E "s/(^|[[:space:]])dbname=[^[:space:]]*/\\1dbname=$name/" <<<"$admin_url")" >&3
else
  printf '%s dbname=%s\n' "$admin_url" "$name" >&3
fi
