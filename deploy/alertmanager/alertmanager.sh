#!/usr/bin/env bash
# FleetPulse local Alertmanager: the Debian `prometheus-alertmanager` binary, one webhook receiver.
#
#   deploy/alertmanager/alertmanager.sh start    render the config, start, wait until /-/ready
#   deploy/alertmanager/alertmanager.sh stop     SIGTERM, wait up to 30 s, then SIGKILL (idempotent)
#   deploy/alertmanager/alertmanager.sh status   exit 0 when running and ready, 3 when not
#
# Env: ALERTMANAGER_PORT (default 19093), ALERTMANAGER_WEBHOOK_URL (the receiver, default
#      http://127.0.0.1:19094/alerts), ALERTMANAGER_GROUP_WAIT (default 30s),
#      ALERTMANAGER_GROUP_INTERVAL (default 5m), ALERTMANAGER_START_TIMEOUT (seconds, default 60),
#      ALERTMANAGER_BIN (default prometheus-alertmanager), ALERTMANAGER_CACHE_DIR (default
#      <repo>/.cache/alertmanager-<port>, git-ignored): config, pid, log and state live there.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd -P)"
PORT="${ALERTMANAGER_PORT:-19093}"
WEBHOOK_URL="${ALERTMANAGER_WEBHOOK_URL:-http://127.0.0.1:19094/alerts}"
GROUP_WAIT="${ALERTMANAGER_GROUP_WAIT:-30s}"
GROUP_INTERVAL="${ALERTMANAGER_GROUP_INTERVAL:-5m}"
START_TIMEOUT="${ALERTMANAGER_START_TIMEOUT:-60}"
BIN="${ALERTMANAGER_BIN:-prometheus-alertmanager}"
CACHE_DIR="${ALERTMANAGER_CACHE_DIR:-$REPO_ROOT/.cache/alertmanager-$PORT}"
CONFIG="$CACHE_DIR/alertmanager.yml"
PID_FILE="$CACHE_DIR/alertmanager.pid"
LOG_FILE="$CACHE_DIR/alertmanager.log"
STOP_TIMEOUT=30

log() { printf 'alertmanager.sh: %s\n' "$*"; }
die() { printf 'alertmanager.sh: error: %s\n' "$*" >&2; exit 1; }

[[ "$PORT" =~ ^[0-9]+$ ]] && (( PORT >= 1 && PORT <= 65535 )) \
  || die "ALERTMANAGER_PORT must be a port number (1-65535), got '$PORT'"
for duration in "$GROUP_WAIT" "$GROUP_INTERVAL"; do
  [[ "$duration" =~ ^[0-9]+(ms|s|m|h)$ ]] || die "group wait/interval must be durations like 1s, got '$duration'"
done
[[ "$WEBHOOK_URL" =~ ^https?://[^[:space:]\"]+$ ]] || die "ALERTMANAGER_WEBHOOK_URL must be an http(s) URL, got '$WEBHOOK_URL'"
[[ "$START_TIMEOUT" =~ ^[0-9]+$ ]] || die "ALERTMANAGER_START_TIMEOUT must be whole seconds"

running_pid() { # the pid of our Alertmanager on PORT, or fail
  local pid cmdline
  [[ -f "$PID_FILE" ]] || return 1
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  [[ "$cmdline" == *"--config.file=$CONFIG"* ]] || return 1
  printf '%s\n' "$pid"
}

ready() { curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/-/ready" 2>/dev/null; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

render_config() {
  mkdir -p "$CACHE_DIR"
  sed -e "s|@GROUP_WAIT@|$GROUP_WAIT|g" -e "s|@GROUP_INTERVAL@|$GROUP_INTERVAL|g" \
      -e "s|@WEBHOOK_URL@|$WEBHOOK_URL|g" "$SCRIPT_DIR/alertmanager.yml.in" >"$CONFIG.tmp"
  mv -f "$CONFIG.tmp" "$CONFIG"
}

stop_pid() {
  local pid="$1" i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < STOP_TIMEOUT * 4; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.25
  done
  log "pid $pid still alive after ${STOP_TIMEOUT} s; sending SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

cmd_start() {
  local pid
  if pid="$(running_pid)"; then
    log "already running on 127.0.0.1:$PORT (pid $pid)"
    return 0
  fi
  command -v "$BIN" >/dev/null 2>&1 \
    || die "$BIN not found: install the Debian package (apt-get install -y prometheus-alertmanager) or set ALERTMANAGER_BIN"
  port_open && die "port $PORT is already in use; set ALERTMANAGER_PORT to a free port"
  render_config
  log "starting $("$BIN" --version 2>&1 | head -n 1) on 127.0.0.1:$PORT, log $LOG_FILE"
  local launcher=()
  command -v setsid >/dev/null 2>&1 && launcher=(setsid)
  # --cluster.listen-address= : no gossip port, one instance is all development needs
  "${launcher[@]}" "$BIN" "--config.file=$CONFIG" "--storage.path=$CACHE_DIR/data" \
    "--web.listen-address=127.0.0.1:$PORT" "--cluster.listen-address=" \
    </dev/null >"$LOG_FILE" 2>&1 &
  pid=$!
  printf '%s\n' "$pid" >"$PID_FILE"
  local deadline=$(( $(date +%s) + START_TIMEOUT ))
  until ready; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE"
      tail -n 30 "$LOG_FILE" >&2 || true
      die "Alertmanager exited during startup (see $LOG_FILE)"
    fi
    if (( $(date +%s) >= deadline )); then
      tail -n 30 "$LOG_FILE" >&2 || true
      stop_pid "$pid"
      rm -f "$PID_FILE"
      die "Alertmanager not ready after ${START_TIMEOUT} s"
    fi
    sleep 0.2
  done
  log "ready on http://127.0.0.1:$PORT (pid $pid), receiver $WEBHOOK_URL"
}

cmd_stop() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$PID_FILE"
    log "not running on port $PORT"
    return 0
  fi
  stop_pid "$pid"
  rm -f "$PID_FILE"
  log "stopped (pid $pid)"
}

cmd_status() {
  local pid
  if pid="$(running_pid)" && ready; then
    log "running on http://127.0.0.1:$PORT (pid $pid), receiver $WEBHOOK_URL"
    return 0
  fi
  log "not running (port $PORT)"
  return 3
}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
