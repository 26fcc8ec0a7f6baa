#!/usr/bin/env bash
# FleetPulse local PostgreSQL: a throwaway server for the Iceberg lake's SQL catalog when
# several machines share it (lake.catalog = "postgresql+psycopg2://…"). Debian's postgresql
# binaries (deploy/system-deps.sh), initdb + pg_ctl, no systemd; as root it runs as the
# `postgres` user (PostgreSQL refuses to run as root), otherwise as the caller.
#
#   deploy/postgres/postgres.sh start    initdb if needed, start, create the test user and database
#   deploy/postgres/postgres.sh stop     fast shutdown (idempotent)
#   deploy/postgres/postgres.sh status   exit 0 when running, 3 when not
#   deploy/postgres/postgres.sh env      print the FLEETPULSE_LAKE__CATALOG a client needs
#   deploy/postgres/postgres.sh reset    stop, then wipe the data dir
#
# Env: PG_PORT (default 19648; it listens on 127.0.0.1 only), PG_USER / PG_PASSWORD /
#      PG_DATABASE (the catalog's user, password and database; default fleetpulse /
#      fleetpulse-secret / fleetpulse_catalog: a test server on the loopback only),
#      PG_BIN (the folder of initdb and pg_ctl; default: pg_ctl on PATH, else the newest
#      /usr/lib/postgresql/*/bin), PG_DATA (default .cache/postgres/data-<PG_PORT>, git-ignored;
#      under root, $TMPDIR/fleetpulse-postgres/data-<PG_PORT> when the `postgres` user cannot
#      reach the checkout); the server's log is <PG_DATA>.log.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd -P)"
CACHE_DIR="$REPO_ROOT/.cache/postgres"

PG_PORT="${PG_PORT:-19648}"
PG_USER="${PG_USER:-fleetpulse}"
PG_PASSWORD="${PG_PASSWORD:-fleetpulse-secret}"
PG_DATABASE="${PG_DATABASE:-fleetpulse_catalog}"
DATA_DIR="${PG_DATA:-$CACHE_DIR/data-$PG_PORT}"
# under root the server runs as `postgres`, which may not reach a checkout in a private home:
# then the data go under the temporary folder instead
if [[ -z "${PG_DATA:-}" && "$(id -u)" == 0 ]] && id postgres >/dev/null 2>&1 \
    && ! runuser -u postgres -- test -x "$REPO_ROOT" 2>/dev/null; then
  DATA_DIR="${TMPDIR:-/tmp}/fleetpulse-postgres/data-$PG_PORT"
fi
LOG_FILE="$DATA_DIR.log"

log() { printf 'postgres.sh: %s\n' "$*"; }
die() { printf 'postgres.sh: error: %s\n' "$*" >&2; exit 1; }

[[ "$PG_PORT" =~ ^[0-9]+$ ]] && (( PG_PORT >= 1 && PG_PORT <= 65535 )) \
  || die "PG_PORT must be a port number (1-65535), got '$PG_PORT'"
[[ "$PG_USER" =~ ^[a-z_][a-z0-9_]*$ ]] || die "PG_USER must be a plain SQL name, got '$PG_USER'"
[[ "$PG_DATABASE" =~ ^[a-z_][a-z0-9_]*$ ]] \
  || die "PG_DATABASE must be a plain SQL name, got '$PG_DATABASE'"
[[ "$PG_PASSWORD" =~ ^[A-Za-z0-9_.-]+$ ]] \
  || die "PG_PASSWORD: letters, digits and _ . - only (it goes into a URL unescaped)"

find_bin() {
  if [[ -n "${PG_BIN:-}" ]]; then
    printf '%s\n' "$PG_BIN"
  elif command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v pg_ctl)")"
  else
    local newest
    newest="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    [[ -n "$newest" ]] || die "PostgreSQL not found: apt-get install -y postgresql (deploy/system-deps.sh) or set PG_BIN"
    printf '%s\n' "$newest"
  fi
}
BIN="$(find_bin)"
[[ -x "$BIN/pg_ctl" && -x "$BIN/initdb" && -x "$BIN/psql" ]] \
  || die "no pg_ctl, initdb and psql in $BIN (set PG_BIN)"

as_owner() { # run a command as the server's owner: `postgres` under root, else the caller
  if [[ "$(id -u)" == 0 ]]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

psql_admin() { # superuser, over the Unix socket in the data dir (no password: local only)
  as_owner "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$DATA_DIR" -p "$PG_PORT" -U postgres \
    -d postgres "$@"
}

running() { as_owner "$BIN/pg_ctl" -D "$DATA_DIR" status >/dev/null 2>&1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PG_PORT") 2>/dev/null; }

cmd_init() {
  [[ -f "$DATA_DIR/PG_VERSION" ]] && return 0
  mkdir -p "$DATA_DIR"
  if [[ "$(id -u)" == 0 ]]; then
    id postgres >/dev/null 2>&1 || die "no 'postgres' user (apt-get install -y postgresql creates it)"
    chown postgres: "$DATA_DIR"
    as_owner test -w "$DATA_DIR" \
      || die "the postgres user cannot reach $DATA_DIR (a folder above it is private): set PG_DATA"
  fi
  chmod 700 "$DATA_DIR"
  log "initdb in $DATA_DIR"
  # superuser `postgres` on the socket (trust: only this machine's owner of the data dir can
  # reach it); every TCP login needs a password
  as_owner "$BIN/initdb" -D "$DATA_DIR" -U postgres --auth-local=trust \
    --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$DATA_DIR.initdb.log" 2>&1 \
    || { tail -n 20 "$DATA_DIR.initdb.log" >&2; die "initdb failed (see $DATA_DIR.initdb.log)"; }
}

cmd_start() {
  if running; then
    log "already running on 127.0.0.1:$PG_PORT (data $DATA_DIR)"
    return 0
  fi
  port_open && die "port $PG_PORT is already in use; set PG_PORT to a free port"
  cmd_init
  touch "$LOG_FILE"
  [[ "$(id -u)" == 0 ]] && chown postgres: "$LOG_FILE"
  as_owner "$BIN/pg_ctl" -D "$DATA_DIR" -l "$LOG_FILE" -w -t 60 \
    -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $DATA_DIR" start >/dev/null \
    || { tail -n 20 "$LOG_FILE" >&2; die "PostgreSQL did not start (see $LOG_FILE)"; }
  if [[ -z "$(psql_admin -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'")" ]]; then
    psql_admin -c "CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD'"
  fi
  if [[ -z "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DATABASE'")" ]]; then
    psql_admin -c "CREATE DATABASE $PG_DATABASE OWNER $PG_USER"
  fi
  log "ready on 127.0.0.1:$PG_PORT, database $PG_DATABASE for $PG_USER (data $DATA_DIR)"
}

cmd_stop() {
  if ! running; then
    log "not running on port $PG_PORT"
    return 0
  fi
  as_owner "$BIN/pg_ctl" -D "$DATA_DIR" -m fast -w -t 60 stop >/dev/null
  log "stopped (port $PG_PORT)"
}

cmd_status() {
  if running && port_open; then
    log "running on 127.0.0.1:$PG_PORT (data $DATA_DIR)"
    return 0
  fi
  log "not running (port $PG_PORT)"
  return 3
}

cmd_env() {
  echo "FLEETPULSE_LAKE__CATALOG=postgresql+psycopg2://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DATABASE"
}

cmd_reset() {
  cmd_stop
  rm -rf "$DATA_DIR" "$DATA_DIR.initdb.log" "$LOG_FILE"
  log "wiped $DATA_DIR"
}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  reset) cmd_reset ;;
  *) usage; exit 2 ;;
esac
