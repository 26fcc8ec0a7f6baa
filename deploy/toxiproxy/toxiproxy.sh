#!/usr/bin/env bash
# Toxiproxy (Shopify's TCP fault proxy) for the network fault scenarios (tests/faults).
# Built from source with `go install` through the Go module proxy, once per version, into a cache
# outside the work tree (like the Kafka jars); no release download, no Docker.
#
#   deploy/toxiproxy/toxiproxy.sh fetch    build the server binary if the cache lacks it
#   deploy/toxiproxy/toxiproxy.sh path     print the binary's path (fetch first if needed)
#   deploy/toxiproxy/toxiproxy.sh start    fetch if needed, start the API on 127.0.0.1:$TOXIPROXY_PORT, wait
#   deploy/toxiproxy/toxiproxy.sh stop     SIGTERM (idempotent)
#   deploy/toxiproxy/toxiproxy.sh status   exit 0 when running, 3 when not
#
# Env: TOXIPROXY_VERSION (default v2.12.0), TOXIPROXY_PORT (API port, default 28474),
#      TOXIPROXY_CACHE (default ~/.cache/fleetpulse/toxiproxy), GO (default go).
# Proxies and toxics are made through the HTTP API (tests/faults/toxiproxy.py).
set -euo pipefail

VERSION="${TOXIPROXY_VERSION:-v2.12.0}"
PORT="${TOXIPROXY_PORT:-28474}"
CACHE="${TOXIPROXY_CACHE:-$HOME/.cache/fleetpulse/toxiproxy}"
GO="${GO:-go}"
BIN_DIR="$CACHE/$VERSION"
BIN="$BIN_DIR/server"
PID_FILE="$CACHE/toxiproxy-$PORT.pid"
LOG_FILE="$CACHE/toxiproxy-$PORT.log"

log() { printf 'toxiproxy.sh: %s\n' "$*"; }
die() { printf 'toxiproxy.sh: error: %s\n' "$*" >&2; exit 1; }

[[ "$PORT" =~ ^[0-9]+$ ]] && (( PORT >= 1 && PORT <= 65535 )) \
  || die "TOXIPROXY_PORT must be a port number (1-65535), got '$PORT'"
[[ "$VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "TOXIPROXY_VERSION must look like v2.12.0, got '$VERSION'"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

running_pid() {
  local pid
  [[ -f "$PID_FILE" ]] || return 1
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  [[ "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" == "$BIN" ]] || return 1
  printf '%s\n' "$pid"
}

cmd_fetch() {
  [[ -x "$BIN" ]] && return 0
  command -v "$GO" >/dev/null 2>&1 \
    || die "go not found: the network fault tests build Toxiproxy with Go 1.22+ (install golang, or set GO)"
  mkdir -p "$BIN_DIR"
  exec 8>"$CACHE/.lock-fetch"
  command -v flock >/dev/null 2>&1 && flock -w 900 8
  [[ -x "$BIN" ]] && return 0
  log "building Toxiproxy $VERSION with $("$GO" version | cut -d' ' -f3) into $BIN_DIR ..."
  # outside any module, so go install resolves exactly this version; GOFLAGS cleared for that
  (cd "$BIN_DIR" && GOFLAGS= GOBIN="$BIN_DIR" nice "$GO" install \
      "github.com/Shopify/toxiproxy/v2/cmd/server@$VERSION") \
    || die "go install of Toxiproxy $VERSION failed"
  [[ -x "$BIN" ]] || die "no server binary in $BIN_DIR after go install"
  log "built $BIN"
}

cmd_start() {
  local pid i
  if pid="$(running_pid)"; then
    log "already running on 127.0.0.1:$PORT (pid $pid)"
    return 0
  fi
  port_open "$PORT" && die "port $PORT is in use by another process; set TOXIPROXY_PORT"
  cmd_fetch
  setsid "$BIN" -host 127.0.0.1 -port "$PORT" </dev/null >"$LOG_FILE" 2>&1 &
  pid=$!
  printf '%s\n' "$pid" >"$PID_FILE"
  for ((i = 0; i < 120; i++)); do
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$LOG_FILE" >&2; die "Toxiproxy exited at start"; }
    port_open "$PORT" && { log "Toxiproxy $VERSION API on 127.0.0.1:$PORT (pid $pid)"; return 0; }
    sleep 0.25
  done
  kill "$pid" 2>/dev/null || true
  die "Toxiproxy API not up on :$PORT after 30 s (log $LOG_FILE)"
}

cmd_stop() {
  local pid i
  if ! pid="$(running_pid)"; then
    rm -f "$PID_FILE"
    log "not running on port $PORT"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 40; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PID_FILE"
  log "stopped (port $PORT)"
}

cmd_status() {
  local pid
  if pid="$(running_pid)"; then
    log "running on 127.0.0.1:$PORT (pid $pid)"
    return 0
  fi
  log "stopped (port $PORT)"
  return 3
}

case "${1:-}" in
  fetch) cmd_fetch ;;
  path) cmd_fetch >&2; printf '%s\n' "$BIN" ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  -h|--help|help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
