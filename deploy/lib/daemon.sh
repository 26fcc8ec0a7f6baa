# Shared by deploy/prometheus/prometheus.sh and deploy/alertmanager/alertmanager.sh: start a
# Debian-packaged daemon on 127.0.0.1:$PORT with a rendered config, wait for /-/ready, stop it.
#
# The sourcing script sets NAME (Prometheus), ENV_PREFIX (PROMETHEUS), PACKAGE (the Debian
# package), PORT, BIN, CACHE_DIR, CONFIG, START_TIMEOUT and READY_NOTE, and defines
# render_config and daemon_args (prints the daemon's arguments, one per line); then it calls
# `daemon_main "$@"`.

STOP_TIMEOUT=30
SCRIPT_PATH="${BASH_SOURCE[1]}"
SCRIPT_NAME="$(basename "$SCRIPT_PATH")"
PID_FILE="$CACHE_DIR/${SCRIPT_NAME%.sh}.pid"
LOG_FILE="$CACHE_DIR/${SCRIPT_NAME%.sh}.log"

log() { printf '%s: %s\n' "$SCRIPT_NAME" "$*"; }
die() { printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2; exit 1; }

check_common_env() {
  [[ "$PORT" =~ ^[0-9]+$ ]] && (( PORT >= 1 && PORT <= 65535 )) \
    || die "${ENV_PREFIX}_PORT must be a port number (1-65535), got '$PORT'"
  [[ "$START_TIMEOUT" =~ ^[0-9]+$ ]] || die "${ENV_PREFIX}_START_TIMEOUT must be whole seconds"
}

running_pid() { # the pid of our daemon on PORT, or fail
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
  local pid args=()
  if pid="$(running_pid)"; then
    log "already running on 127.0.0.1:$PORT (pid $pid)"
    return 0
  fi
  command -v "$BIN" >/dev/null 2>&1 \
    || die "$BIN not found: install the Debian package (apt-get install -y $PACKAGE) or set ${ENV_PREFIX}_BIN"
  port_open && die "port $PORT is already in use; set ${ENV_PREFIX}_PORT to a free port"
  mkdir -p "$CACHE_DIR"
  render_config
  mapfile -t args < <(daemon_args)
  log "starting $("$BIN" --version 2>&1 | head -n 1) on 127.0.0.1:$PORT, log $LOG_FILE"
  local launcher=()
  command -v setsid >/dev/null 2>&1 && launcher=(setsid)
  "${launcher[@]}" "$BIN" "--config.file=$CONFIG" "${args[@]}" </dev/null >"$LOG_FILE" 2>&1 &
  pid=$!
  printf '%s\n' "$pid" >"$PID_FILE"
  local deadline=$(( $(date +%s) + START_TIMEOUT ))
  until ready; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE"
      tail -n 30 "$LOG_FILE" >&2 || true
      die "$NAME exited during startup (see $LOG_FILE)"
    fi
    if (( $(date +%s) >= deadline )); then
      tail -n 30 "$LOG_FILE" >&2 || true
      stop_pid "$pid"
      rm -f "$PID_FILE"
      die "$NAME not ready after ${START_TIMEOUT} s"
    fi
    sleep 0.2
  done
  log "ready on http://127.0.0.1:$PORT (pid $pid), $READY_NOTE"
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
    log "running on http://127.0.0.1:$PORT (pid $pid), $READY_NOTE"
    return 0
  fi
  log "not running (port $PORT)"
  return 3
}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SCRIPT_PATH"; }

daemon_main() {
  case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    -h|--help|help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}
