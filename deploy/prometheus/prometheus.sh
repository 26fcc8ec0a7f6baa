#!/usr/bin/env bash
# FleetPulse local Prometheus: the Debian `prometheus` binary with a rendered config.
#
#   deploy/prometheus/prometheus.sh start    render the config, start, wait until /-/ready
#   deploy/prometheus/prometheus.sh stop     SIGTERM, wait up to 30 s, then SIGKILL (idempotent)
#   deploy/prometheus/prometheus.sh status   exit 0 when running and ready, 3 when not
#
# Env: PROMETHEUS_PORT (default 19090), PROMETHEUS_SCRAPE_INTERVAL (default 15s),
#      PROMETHEUS_TARGETS (file_sd JSON file; default <cache>/targets.json, created as []),
#      PROMETHEUS_START_TIMEOUT (seconds, default 60), PROMETHEUS_BIN (default prometheus),
#      PROMETHEUS_CACHE_DIR (default <repo>/.cache/prometheus-<port>, git-ignored): config,
#      pid, log and the TSDB all live there.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd -P)"
PORT="${PROMETHEUS_PORT:-19090}"
SCRAPE_INTERVAL="${PROMETHEUS_SCRAPE_INTERVAL:-15s}"
START_TIMEOUT="${PROMETHEUS_START_TIMEOUT:-60}"
BIN="${PROMETHEUS_BIN:-prometheus}"
CACHE_DIR="${PROMETHEUS_CACHE_DIR:-$REPO_ROOT/.cache/prometheus-$PORT}"
TARGETS="${PROMETHEUS_TARGETS:-$CACHE_DIR/targets.json}"
CONFIG="$CACHE_DIR/prometheus.yml"
PID_FILE="$CACHE_DIR/prometheus.pid"
LOG_FILE="$CACHE_DIR/prometheus.log"
STOP_TIMEOUT=30

log() { printf 'prometheus.sh: %s\n' "$*"; }
die() { printf 'prometheus.sh: error: %s\n' "$*" >&2; exit 1; }

[[ "$PORT" =~ ^[0-9]+$ ]] && (( PORT >= 1 && PORT <= 65535 )) \
  || die "PROMETHEUS_PORT must be a port number (1-65535), got '$PORT'"
[[ "$SCRAPE_INTERVAL" =~ ^[0-9]+(ms|s|m)$ ]] \
  || die "PROMETHEUS_SCRAPE_INTERVAL must be a duration like 1s or 15s, got '$SCRAPE_INTERVAL'"
[[ "$START_TIMEOUT" =~ ^[0-9]+$ ]] || die "PROMETHEUS_START_TIMEOUT must be whole seconds"

running_pid() { # the pid of our Prometheus on PORT, or fail
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
  local timeout="$SCRAPE_INTERVAL"  # may not exceed the interval
  mkdir -p "$CACHE_DIR"
  [[ -f "$TARGETS" ]] || printf '[]\n' >"$TARGETS"
  sed -e "s|@SCRAPE_INTERVAL@|$SCRAPE_INTERVAL|g" -e "s|@SCRAPE_TIMEOUT@|$timeout|g" \
      -e "s|@TARGETS_FILE@|$TARGETS|g" "$SCRIPT_DIR/prometheus.yml.in" >"$CONFIG.tmp"
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
    || die "$BIN not found: install the Debian package (apt-get install -y prometheus) or set PROMETHEUS_BIN"
  port_open && die "port $PORT is already in use; set PROMETHEUS_PORT to a free port"
  render_config
  log "starting $("$BIN" --version 2>&1 | head -n 1) on 127.0.0.1:$PORT, log $LOG_FILE"
  local launcher=()
  command -v setsid >/dev/null 2>&1 && launcher=(setsid)
  "${launcher[@]}" "$BIN" "--config.file=$CONFIG" "--storage.tsdb.path=$CACHE_DIR/data" \
    "--storage.tsdb.retention.time=1d" "--web.listen-address=127.0.0.1:$PORT" \
    </dev/null >"$LOG_FILE" 2>&1 &
  pid=$!
  printf '%s\n' "$pid" >"$PID_FILE"
  local deadline=$(( $(date +%s) + START_TIMEOUT ))
  until ready; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE"
      tail -n 30 "$LOG_FILE" >&2 || true
      die "Prometheus exited during startup (see $LOG_FILE)"
    fi
    if (( $(date +%s) >= deadline )); then
      tail -n 30 "$LOG_FILE" >&2 || true
      stop_pid "$pid"
      rm -f "$PID_FILE"
      die "Prometheus not ready after ${START_TIMEOUT} s"
    fi
    sleep 0.2
  done
  log "ready on http://127.0.0.1:$PORT (pid $pid), targets $TARGETS"
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
    log "running on http://127.0.0.1:$PORT (pid $pid), data $CACHE_DIR/data"
    return 0
  fi
  log "not running (port $PORT)"
  return 3
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  -h|--help|help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
