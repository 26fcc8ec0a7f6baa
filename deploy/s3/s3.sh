#!/usr/bin/env bash
# FleetPulse local object store: s3proxy (Apache-2.0, org.gaul:s3proxy jar-with-dependencies,
# from Maven) with its filesystem backend, an S3 API on 127.0.0.1 for the Iceberg lake's tests.
# It runs on the Java that Kafka uses (deploy/kafka/kafka.sh). No Docker.
#
#   deploy/s3/s3.sh fetch    copy the s3proxy jar into .cache/s3/lib (once per version)
#   deploy/s3/s3.sh start    fetch if needed, start, wait until it answers HTTP
#   deploy/s3/s3.sh stop     SIGTERM, wait up to 30 s, then SIGKILL (idempotent)
#   deploy/s3/s3.sh status   exit 0 when running, 3 when not
#   deploy/s3/s3.sh env      print the FLEETPULSE_LAKE__* variables a client needs
#   deploy/s3/s3.sh reset    stop, then wipe the data dir
#
# Env: S3_PORT (default 19645), S3_ACCESS_KEY / S3_SECRET_KEY (the credentials s3proxy accepts;
#      default fleetpulse / fleetpulse-secret: a test store on the loopback only),
#      S3_START_TIMEOUT (seconds, default 60), S3_HEAP_OPTS (default -Xmx256m),
#      S3PROXY_VERSION (default 3.0.0), JAVA_HOME (optional), MVN (default mvn).
# The buckets are folders under .cache/s3/data-<S3_PORT> (git-ignored).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd -P)"
CACHE_DIR="$REPO_ROOT/.cache/s3"
LIB_DIR="$CACHE_DIR/lib"

S3_PORT="${S3_PORT:-19645}"
S3_ACCESS_KEY="${S3_ACCESS_KEY:-fleetpulse}"
S3_SECRET_KEY="${S3_SECRET_KEY:-fleetpulse-secret}"
START_TIMEOUT="${S3_START_TIMEOUT:-60}"
STOP_TIMEOUT=30
HEAP_OPTS="${S3_HEAP_OPTS:--Xmx256m}"
VERSION="${S3PROXY_VERSION:-3.0.0}"
MVN="${MVN:-mvn}"
if [[ -n "${JAVA_HOME:-}" && -x "${JAVA_HOME}/bin/java" ]]; then
  JAVA="$JAVA_HOME/bin/java"
else
  JAVA=java
fi

log() { printf 's3.sh: %s\n' "$*"; }
die() { printf 's3.sh: error: %s\n' "$*" >&2; exit 1; }

[[ "$S3_PORT" =~ ^[0-9]+$ ]] && (( S3_PORT >= 1 && S3_PORT <= 65535 )) \
  || die "S3_PORT must be a port number (1-65535), got '$S3_PORT'"
[[ "$START_TIMEOUT" =~ ^[0-9]+$ ]] || die "S3_START_TIMEOUT must be whole seconds, got '$START_TIMEOUT'"
[[ "$VERSION" =~ ^[0-9][0-9A-Za-z.-]*$ ]] || die "S3PROXY_VERSION looks wrong: '$VERSION'"

JAR="$LIB_DIR/s3proxy-$VERSION-jar-with-dependencies.jar"
DATA_DIR="$CACHE_DIR/data-$S3_PORT"
CONF_FILE="$CACHE_DIR/s3proxy-$S3_PORT.conf"
PID_FILE="$CACHE_DIR/s3proxy-$S3_PORT.pid"
LOG_FILE="$CACHE_DIR/s3proxy-$S3_PORT.log"

take_lock() { # $1 = fd number, $2 = lock name (concurrent callers must not race)
  command -v flock >/dev/null 2>&1 || return 0
  mkdir -p "$CACHE_DIR"
  eval "exec $1>\"\$CACHE_DIR/.lock-$2\""
  flock -w 600 "$1" || die "timed out waiting for lock $CACHE_DIR/.lock-$2"
}

require_java() {
  command -v "$JAVA" >/dev/null 2>&1 \
    || die "java not found: s3proxy needs Java 17+ (the one Kafka uses; or set JAVA_HOME)"
}

pid_alive() { # $1 = pid; true when it is our s3proxy JVM for this port's config
  local pid="$1" cmdline
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  [[ "$cmdline" == *"--properties $CONF_FILE"* ]]
}

running_pid() {
  local pid
  [[ -f "$PID_FILE" ]] || return 1
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  pid_alive "$pid" || return 1
  printf '%s\n' "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$S3_PORT") 2>/dev/null; }

answers() { # any HTTP answer on / (an anonymous request is refused with 403: that is up)
  local code
  code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$S3_PORT/" 2>/dev/null || true)"
  [[ "$code" =~ ^[1-5][0-9][0-9]$ ]]
}

render_conf() {
  mkdir -p "$CACHE_DIR" "$DATA_DIR"
  umask 077
  cat >"$CONF_FILE.tmp" <<CONF
s3proxy.endpoint=http://127.0.0.1:$S3_PORT
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=$S3_ACCESS_KEY
s3proxy.credential=$S3_SECRET_KEY
jclouds.provider=filesystem-nio2
jclouds.filesystem.basedir=$DATA_DIR
CONF
  mv -f "$CONF_FILE.tmp" "$CONF_FILE"
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

cmd_fetch() {
  take_lock 8 fetch
  if [[ -f "$JAR" ]]; then
    log "s3proxy $VERSION already in $LIB_DIR (skip fetch)"
    return 0
  fi
  require_java
  command -v "$MVN" >/dev/null 2>&1 || die "mvn not found: install Maven (or set MVN) to fetch s3proxy"
  log "fetching s3proxy $VERSION with Maven into $LIB_DIR ..."
  mkdir -p "$LIB_DIR"
  local mvn_log="$CACHE_DIR/fetch.log"
  if ! "$MVN" -B -q dependency:copy \
        "-Dartifact=org.gaul:s3proxy:$VERSION:jar:jar-with-dependencies" \
        -Dtransitive=false "-DoutputDirectory=$LIB_DIR" >"$mvn_log" 2>&1; then
    tail -n 40 "$mvn_log" >&2 || true
    die "Maven could not fetch org.gaul:s3proxy:$VERSION (full output: $mvn_log)"
  fi
  [[ -f "$JAR" ]] || die "$JAR missing after fetch"
  log "fetched $(basename "$JAR")"
}

cmd_start() {
  take_lock 9 "start-$S3_PORT"
  local pid
  if pid="$(running_pid)"; then
    log "already running on 127.0.0.1:$S3_PORT (pid $pid)"
    return 0
  fi
  port_open && die "port $S3_PORT is already in use; set S3_PORT to a free port"
  cmd_fetch 8>&-
  require_java
  render_conf
  local launcher=()
  # setsid: its own session, so it outlives this shell and a Ctrl-C aimed at the caller
  command -v setsid >/dev/null 2>&1 && launcher=(setsid)
  # shellcheck disable=SC2086 # HEAP_OPTS is meant to split into separate flags
  "${launcher[@]}" "$JAVA" $HEAP_OPTS -Djava.awt.headless=true -jar "$JAR" \
    --properties "$CONF_FILE" </dev/null >"$LOG_FILE" 2>&1 8>&- 9>&- &
  pid=$!
  printf '%s\n' "$pid" >"$PID_FILE"
  local deadline=$(( $(date +%s) + START_TIMEOUT ))
  until answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE"
      tail -n 30 "$LOG_FILE" >&2 || true
      die "s3proxy exited during startup (see $LOG_FILE)"
    fi
    if (( $(date +%s) >= deadline )); then
      tail -n 30 "$LOG_FILE" >&2 || true
      stop_pid "$pid"
      rm -f "$PID_FILE"
      die "s3proxy not answering after ${START_TIMEOUT} s"
    fi
    sleep 0.2
  done
  log "ready on http://127.0.0.1:$S3_PORT (pid $pid), buckets under $DATA_DIR"
}

cmd_stop() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$PID_FILE"
    log "not running on port $S3_PORT"
    return 0
  fi
  stop_pid "$pid"
  rm -f "$PID_FILE"
  log "stopped (pid $pid)"
}

cmd_status() {
  local pid
  if pid="$(running_pid)" && answers; then
    log "running on http://127.0.0.1:$S3_PORT (pid $pid)"
    return 0
  fi
  log "not running (port $S3_PORT)"
  return 3
}

cmd_env() {
  echo "FLEETPULSE_LAKE__S3_ENDPOINT=http://127.0.0.1:$S3_PORT"
  echo "FLEETPULSE_LAKE__S3_ACCESS_KEY_ID=$S3_ACCESS_KEY"
  echo "FLEETPULSE_LAKE__S3_SECRET_ACCESS_KEY=$S3_SECRET_KEY"
}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  reset) cmd_stop; rm -rf "$DATA_DIR"; log "wiped $DATA_DIR" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
