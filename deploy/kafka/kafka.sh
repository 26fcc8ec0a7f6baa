#!/usr/bin/env bash
# FleetPulse local Kafka: a real single-node Apache Kafka 4.x broker (KRaft, broker + controller
# in one JVM on 127.0.0.1), run from Maven jars. No Docker, no release tarball.
#
#   deploy/kafka/kafka.sh fetch    resolve the broker jars into .cache/kafka/lib (once per version)
#   deploy/kafka/kafka.sh start    fetch if needed, format storage once, start, wait until ready
#   deploy/kafka/kafka.sh stop     SIGTERM, wait up to 30 s, then SIGKILL (idempotent)
#   deploy/kafka/kafka.sh status   exit 0 when running, 3 when not
#   deploy/kafka/kafka.sh reset    stop, then wipe the data dir
#
# Env: KAFKA_PORT (client port, default 19092), KAFKA_CONTROLLER_PORT (default KAFKA_PORT+1),
#      KAFKA_START_TIMEOUT (seconds, default 90), KAFKA_HEAP_OPTS (default -Xms512m -Xmx512m),
#      JAVA_HOME (optional: use $JAVA_HOME/bin/java), MVN (default mvn).
# Secure profile: KAFKA_SECURE=1 start adds a SASL_SSL listener on KAFKA_SECURE_PORT (default
#      KAFKA_PORT+2) with a CA and broker certificate made per run (openssl), SCRAM users with
#      per-run passwords (admin, and a principal per component: pipeline/wire/acl.py), and the
#      StandardAuthorizer with those principals' ACLs for the topic prefixes in
#      KAFKA_ACL_PREFIXES (comma-separated, default fleet); the data dir is fresh each run.
#      Files (CA, passwords, client env) land in .cache/kafka/secure-<KAFKA_PORT>; see README.md.
# Proxied listeners: KAFKA_PROXIED_LISTENERS="NAME=LISTEN_PORT:ADVERTISED_PORT ..." adds a
#      PLAINTEXT listener per entry that listens on LISTEN_PORT and advertises ADVERTISED_PORT
#      (a TCP proxy in front of it, e.g. deploy/toxiproxy), so every client that bootstraps
#      through the proxy keeps talking through it. PLAINTEXT on KAFKA_PORT stays direct.
# Everything it writes lives under <repo>/.cache/kafka (git-ignored). See README.md beside it.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd -P)"
CACHE_DIR="$REPO_ROOT/.cache/kafka"
LIB_DIR="$CACHE_DIR/lib"
STAMP_FILE="$LIB_DIR/.fleetpulse-fetched"
POM="$SCRIPT_DIR/pom.xml"
TEMPLATE="$SCRIPT_DIR/server.properties.in"
LOG4J_CONF="$SCRIPT_DIR/log4j2.properties"

KAFKA_PORT="${KAFKA_PORT:-19092}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT=30
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms512m -Xmx512m}"
MVN="${MVN:-mvn}"
if [[ -n "${JAVA_HOME:-}" && -x "${JAVA_HOME}/bin/java" ]]; then
  JAVA="$JAVA_HOME/bin/java"
else
  JAVA=java
fi

log() { printf 'kafka.sh: %s\n' "$*"; }
die() { printf 'kafka.sh: error: %s\n' "$*" >&2; exit 1; }

is_port_number() { [[ "$1" =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 <= 65535 )); }
is_port_number "$KAFKA_PORT" || die "KAFKA_PORT must be a port number (1-65535), got '$KAFKA_PORT'"
if [[ -z "${KAFKA_CONTROLLER_PORT:-}" ]]; then
  KAFKA_CONTROLLER_PORT=$((KAFKA_PORT + 1))
fi
is_port_number "$KAFKA_CONTROLLER_PORT" \
  || die "KAFKA_CONTROLLER_PORT must be a port number (1-65535), got '$KAFKA_CONTROLLER_PORT'"
[[ "$KAFKA_CONTROLLER_PORT" != "$KAFKA_PORT" ]] \
  || die "KAFKA_CONTROLLER_PORT must differ from KAFKA_PORT ($KAFKA_PORT)"
[[ "$START_TIMEOUT" =~ ^[0-9]+$ ]] || die "KAFKA_START_TIMEOUT must be whole seconds, got '$START_TIMEOUT'"

DATA_DIR="$CACHE_DIR/data-$KAFKA_PORT"
SECURE="${KAFKA_SECURE:-0}"
KAFKA_SECURE_PORT="${KAFKA_SECURE_PORT:-$((KAFKA_PORT + 2))}"
SECURE_DIR="$CACHE_DIR/secure-$KAFKA_PORT"
# the topic prefixes (kafka.topic_prefix) whose topics get the per-component ACLs
ACL_PREFIXES="${KAFKA_ACL_PREFIXES:-fleet}"
if [[ "$SECURE" == 1 ]]; then
  is_port_number "$KAFKA_SECURE_PORT" || die "KAFKA_SECURE_PORT must be a port number, got '$KAFKA_SECURE_PORT'"
  DATA_DIR="$CACHE_DIR/data-secure-$KAFKA_PORT"  # never mixed with a plaintext broker's data
fi
PROXIED="${KAFKA_PROXIED_LISTENERS:-}"
if [[ -n "$PROXIED" ]]; then
  [[ "$SECURE" == 1 ]] && die "KAFKA_PROXIED_LISTENERS and KAFKA_SECURE=1 do not combine"
  for entry in $PROXIED; do
    [[ "$entry" =~ ^[A-Z][A-Z0-9_]*=([0-9]+):([0-9]+)$ ]] \
      || die "KAFKA_PROXIED_LISTENERS entries must be NAME=LISTEN_PORT:ADVERTISED_PORT (NAME in capitals), got '$entry'"
    listen_port="${BASH_REMATCH[1]}" advertised_port="${BASH_REMATCH[2]}"
    is_port_number "$listen_port" && is_port_number "$advertised_port" \
      || die "KAFKA_PROXIED_LISTENERS: ports must be 1-65535, got '$entry'"
  done
fi
PID_FILE="$CACHE_DIR/broker-$KAFKA_PORT.pid"
LOG_FILE="$CACHE_DIR/broker-$KAFKA_PORT.log"
PROPS_FILE="$CACHE_DIR/server-$KAFKA_PORT.properties"
TMP_DIR="$CACHE_DIR/tmp"

# --- helpers -----------------------------------------------------------------------------------

pom_property() { # value of <name>…</name> in the POM's <properties>
  sed -n "s:.*<$1>\([^<]*\)</$1>.*:\1:p" "$POM" | head -n 1
}
KAFKA_VERSION="$(pom_property kafka.version)"
[[ -n "$KAFKA_VERSION" ]] || die "cannot read kafka.version from $POM"

now() { date +%s.%N; }
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Take an exclusive lock (if flock exists) so concurrent callers don't race; fd stays open until exit.
take_lock() { # $1 = fd number, $2 = lock name
  command -v flock >/dev/null 2>&1 || return 0
  mkdir -p "$CACHE_DIR"
  eval "exec $1>\"\$CACHE_DIR/.lock-$2\""
  flock -w 600 "$1" || die "timed out waiting for lock $CACHE_DIR/.lock-$2 (another kafka.sh running?)"
}

require_java() {
  command -v "$JAVA" >/dev/null 2>&1 \
    || die "java not found: FleetPulse needs Java 17+ to run Kafka (install e.g. openjdk-17-jre-headless, or set JAVA_HOME)"
  local line ver major
  line="$("$JAVA" -version 2>&1 | head -n 1)"
  ver="$(sed -n 's/.*version "\([^"]*\)".*/\1/p' <<<"$line")"
  if [[ "$ver" == 1.* ]]; then major="$(cut -d. -f2 <<<"$ver")"; else major="${ver%%[.+-]*}"; fi
  if ! [[ "$major" =~ ^[0-9]+$ ]] || (( major < 17 )); then
    die "FleetPulse needs Java 17+ to run Kafka; found ${ver:-an unknown version} ($line) at $(command -v "$JAVA")"
  fi
}

require_mvn() {
  command -v "$MVN" >/dev/null 2>&1 \
    || die "mvn not found: FleetPulse needs Maven to fetch the Kafka jars (install e.g. the 'maven' package, or set MVN)"
}

fetch_stamp() { # identifies the jar set: POM contents (versions) decide
  printf 'kafka=%s pom-sha256=%s\n' "$KAFKA_VERSION" "$(sha256sum "$POM" | cut -d' ' -f1)"
}

jars_present() {
  [[ -f "$STAMP_FILE" && -f "$LIB_DIR/kafka_2.13-$KAFKA_VERSION.jar" ]] \
    && [[ "$(cat "$STAMP_FILE")" == "$(fetch_stamp)" ]]
}

pid_alive() { # $1 = pid; true when it is a live kafka.Kafka JVM running this port's config
  local pid="$1" cmdline
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  [[ "$cmdline" == *"kafka.Kafka $PROPS_FILE"* ]]
}

running_pid() { # prints the pid of our broker on KAFKA_PORT, or fails
  local pid
  [[ -f "$PID_FILE" ]] || return 1
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  pid_alive "$pid" || return 1
  printf '%s\n' "$pid"
}

port_open() { # $1 = port
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

sed_escape() { printf '%s' "$1" | sed -e 's/[\/&|\\]/\\&/g'; }

render_props() {
  mkdir -p "$CACHE_DIR"
  sed -e "s|@KAFKA_PORT@|$KAFKA_PORT|g" \
      -e "s|@KAFKA_CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|g" \
      -e "s|@KAFKA_DATA_DIR@|$(sed_escape "$DATA_DIR")|g" \
      "$TEMPLATE" >"$PROPS_FILE.tmp"
  [[ "$SECURE" == 1 ]] && secure_props >>"$PROPS_FILE.tmp"
  [[ -n "$PROXIED" ]] && proxied_props >>"$PROPS_FILE.tmp"
  mv -f "$PROPS_FILE.tmp" "$PROPS_FILE"
}

jvm_args() {
  # shellcheck disable=SC2206 # HEAP_OPTS is meant to split into separate flags
  JVM_ARGS=($HEAP_OPTS
    -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$LOG4J_CONF"
    "-Dkafka.logs.dir=$CACHE_DIR"
    "-DZstdTempFolder=$TMP_DIR" "-Dorg.xerial.snappy.tempdir=$TMP_DIR" "-Djava.io.tmpdir=$TMP_DIR"
    -cp "$LIB_DIR/*")
}

new_cluster_id() { # Kafka's Uuid form: 22 chars of URL-safe base64, no padding, not starting with '-'
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" != -* ]] && { printf '%s\n' "$id"; return; }
  done
}

print_log_tail() {
  if [[ -f "$LOG_FILE" ]]; then
    printf -- '--- last 40 lines of %s ---\n' "$LOG_FILE" >&2
    tail -n 40 "$LOG_FILE" >&2 || true
    printf -- '--- end of log ---\n' >&2
  fi
}

# --- secure profile --------------------------------------------------------------------------

SECURE_USERS=()  # admin, then a principal per component (pipeline/wire/acl.py), at start

project_python() { # the project's Python (it has the Kafka client), or python3
  local py="${PYTHON:-}"
  [[ -z "$py" && -x "$REPO_ROOT/.venv/bin/python" ]] && py="$REPO_ROOT/.venv/bin/python"
  printf '%s' "${py:-python3}"
}

secure_acls() { # deploy/kafka/secure_acls.py with the repository importable
  PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$(project_python)" "$SCRIPT_DIR/secure_acls.py" "$@" 8>&- 9>&-
}

load_users() {
  local principals
  principals="$(secure_acls --principals)" || die "could not list the principals (pipeline/wire/acl.py)"
  mapfile -t SECURE_USERS < <(printf 'admin\n%s\n' "$principals")
}

make_certs() { # a CA and a broker certificate for 127.0.0.1 / localhost, new every run
  local d="$SECURE_DIR"
  load_users
  rm -rf "$d"
  mkdir -p "$d"
  chmod 700 "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=FleetPulse test CA" \
    -keyout "$d/ca.key" -out "$d/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    >/dev/null 2>&1 || die "openssl could not make the CA"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$d/broker.key" -out "$d/broker.csr" >/dev/null 2>&1 || die "openssl could not make the broker key"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    "authorityKeyIdentifier=keyid" "subjectKeyIdentifier=hash" >"$d/broker.ext"
  openssl x509 -req -in "$d/broker.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 7 -extfile "$d/broker.ext" -out "$d/broker.pem" >/dev/null 2>&1 || die "openssl could not sign the broker certificate"
  # Kafka's PEM keystore: the (PKCS#8, unencrypted) key, then the chain
  cat "$d/broker.key" "$d/broker.pem" "$d/ca.pem" >"$d/broker-keystore.pem"
  local user
  for user in "${SECURE_USERS[@]}"; do
    head -c 18 /dev/urandom | base64 | tr '+/' 'xy' >"$d/$user.password"
  done
  for user in "${SECURE_USERS[@]}"; do
    { # what a client needs to connect as this user (source it, or copy to a config)
      echo "FLEETPULSE_KAFKA__BOOTSTRAP=127.0.0.1:$KAFKA_SECURE_PORT"
      echo "FLEETPULSE_KAFKA__SECURITY_PROTOCOL=SASL_SSL"
      echo "FLEETPULSE_KAFKA__SASL_MECHANISM=SCRAM-SHA-512"
      echo "FLEETPULSE_KAFKA__SASL_USERNAME=$user"
      echo "FLEETPULSE_KAFKA__SASL_PASSWORD_FILE=$d/$user.password"
      echo "FLEETPULSE_KAFKA__SSL_CAFILE=$d/ca.pem"
    } >"$d/$user.env"
  done
  chmod 600 "$d"/*
}

secure_props() { # appended to the rendered template; later keys win in a .properties file
  cat <<PROPS

# --- secure profile (kafka.sh, KAFKA_SECURE=1) ---
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SECURE_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SECURE_PORT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required $(plain_users);
ssl.keystore.type=PEM
ssl.keystore.location=$SECURE_DIR/broker-keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$SECURE_DIR/ca.pem
ssl.client.auth=none
# ACLs: the loopback PLAINTEXT and CONTROLLER listeners (broker, controller, local admin) are
# ANONYMOUS and super users; on SASL_SSL only what an ACL allows.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:admin
allow.everyone.if.no.acl.found=false
PROPS
}

proxied_props() { # extra PLAINTEXT listeners whose advertised port is a proxy's
  local entry name ports listeners="PLAINTEXT://127.0.0.1:$KAFKA_PORT" advertised="PLAINTEXT://127.0.0.1:$KAFKA_PORT"
  local map="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
  for entry in $PROXIED; do
    name="${entry%%=*}"
    ports="${entry#*=}"
    listeners+=",$name://127.0.0.1:${ports%%:*}"
    advertised+=",$name://127.0.0.1:${ports##*:}"
    map+=",$name:PLAINTEXT"
  done
  printf '\n# --- proxied listeners (kafka.sh, KAFKA_PROXIED_LISTENERS) ---\n'
  printf 'listeners=%s,CONTROLLER://127.0.0.1:%s\n' "$listeners" "$KAFKA_CONTROLLER_PORT"
  printf 'advertised.listeners=%s\n' "$advertised"
  printf 'listener.security.protocol.map=%s\n' "$map"
}

plain_users() { # user_<name>="<password>" for the PLAIN mechanism
  local user
  for user in "${SECURE_USERS[@]}"; do
    printf 'user_%s="%s" ' "$user" "$(cat "$SECURE_DIR/$user.password")"
  done
}

scram_args() { # StorageTool --add-scram for every user, both SCRAM mechanisms
  local user mech pw
  for user in "${SECURE_USERS[@]}"; do
    pw="$(cat "$SECURE_DIR/$user.password")"
    for mech in SCRAM-SHA-256 SCRAM-SHA-512; do
      printf '%s\n' --add-scram "$mech=[name=$user,password=$pw]"
    done
  done
}

create_acls() { # over the PLAINTEXT listener (a super user), with the project's Python client
  secure_acls "127.0.0.1:$KAFKA_PORT" "$ACL_PREFIXES"
}

# --- subcommands -------------------------------------------------------------------------------

cmd_fetch() {
  take_lock 8 fetch
  if jars_present; then
    log "Kafka $KAFKA_VERSION jars already in $LIB_DIR (skip fetch)"
    return 0
  fi
  require_java
  require_mvn
  log "fetching Kafka $KAFKA_VERSION jars with Maven into $LIB_DIR ..."
  local t0 tmp mvn_log
  t0="$(now)"
  tmp="$LIB_DIR.tmp.$$"
  mvn_log="$CACHE_DIR/fetch.log"
  rm -rf "$tmp"
  mkdir -p "$CACHE_DIR"
  # copy-dependencies never deletes stale jars, so fill a fresh dir and swap it in
  if ! "$MVN" -B -q -f "$POM" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$tmp" >"$mvn_log" 2>&1; then
    tail -n 40 "$mvn_log" >&2 || true
    rm -rf "$tmp"
    die "Maven could not resolve the Kafka $KAFKA_VERSION jars (full output: $mvn_log)"
  fi
  [[ -f "$tmp/kafka_2.13-$KAFKA_VERSION.jar" ]] || { rm -rf "$tmp"; die "kafka_2.13-$KAFKA_VERSION.jar missing after fetch"; }
  fetch_stamp >"$tmp/.fleetpulse-fetched"
  rm -rf "$LIB_DIR"
  mv "$tmp" "$LIB_DIR"
  log "fetched $(find "$LIB_DIR" -name '*.jar' | wc -l) jars in $(elapsed_since "$t0") s"
}

cmd_start() {
  local t0 pid
  t0="$(now)"
  take_lock 9 "port-$KAFKA_PORT"
  if pid="$(running_pid)"; then
    log "Kafka already running on 127.0.0.1:$KAFKA_PORT (pid $pid); nothing to do"
    return 0
  fi
  rm -f "$PID_FILE"
  if port_open "$KAFKA_PORT"; then
    die "port $KAFKA_PORT is already in use by another process (not a broker started by this script); set KAFKA_PORT to a free port"
  fi
  if port_open "$KAFKA_CONTROLLER_PORT"; then
    die "controller port $KAFKA_CONTROLLER_PORT is already in use; set KAFKA_CONTROLLER_PORT to a free port"
  fi
  require_java
  jars_present || cmd_fetch
  mkdir -p "$CACHE_DIR" "$TMP_DIR"
  if [[ "$SECURE" == 1 ]]; then
    port_open "$KAFKA_SECURE_PORT" && die "secure port $KAFKA_SECURE_PORT is already in use; set KAFKA_SECURE_PORT"
    make_certs
    rm -rf "$DATA_DIR"  # SCRAM users are written at format time: a fresh cluster per run
  fi
  render_props
  local -a JVM_ARGS
  jvm_args

  if [[ ! -f "$DATA_DIR/meta.properties" ]]; then
    local -a SCRAM=()
    [[ "$SECURE" == 1 ]] && mapfile -t SCRAM < <(scram_args)
    # never formatted (or a format that died half way): start from an empty dir
    rm -rf "$DATA_DIR"
    local cid
    cid="$(new_cluster_id)"
    log "formatting KRaft storage in $DATA_DIR (cluster id $cid)"
    if ! "$JAVA" "${JVM_ARGS[@]}" kafka.tools.StorageTool format --ignore-formatted \
          -t "$cid" -c "$PROPS_FILE" "${SCRAM[@]}" >"$CACHE_DIR/format-$KAFKA_PORT.log" 2>&1 8>&- 9>&-; then
      cat "$CACHE_DIR/format-$KAFKA_PORT.log" >&2
      die "formatting $DATA_DIR failed"
    fi
  fi

  [[ -f "$LOG_FILE" ]] && mv -f "$LOG_FILE" "$LOG_FILE.1"
  log "starting Kafka $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT (controller :$KAFKA_CONTROLLER_PORT), log $LOG_FILE"
  # setsid: own session, so the broker outlives this shell and a Ctrl-C aimed at the caller;
  # 9>&- so the JVM does not inherit (and hold) the start lock
  local launcher=()
  command -v setsid >/dev/null 2>&1 && launcher=(setsid)
  "${launcher[@]}" "$JAVA" "${JVM_ARGS[@]}" kafka.Kafka "$PROPS_FILE" \
    </dev/null >"$LOG_FILE" 2>&1 8>&- 9>&- &
  pid=$!
  printf '%s\n' "$pid" >"$PID_FILE"

  local deadline
  deadline=$(( $(date +%s) + START_TIMEOUT ))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE"
      print_log_tail
      die "Kafka exited during startup (see $LOG_FILE)"
    fi
    if port_open "$KAFKA_PORT" && grep -q 'Kafka Server started' "$LOG_FILE" 2>/dev/null; then
      break
    fi
    if (( $(date +%s) >= deadline )); then
      print_log_tail
      log "not ready after ${START_TIMEOUT} s; stopping the half-started broker" >&2
      stop_pid "$pid"
      rm -f "$PID_FILE"
      exit 1
    fi
    sleep 0.25
  done
  if [[ "$SECURE" == 1 ]]; then
    until port_open "$KAFKA_SECURE_PORT"; do
      (( $(date +%s) < deadline )) || { print_log_tail; die "secure listener :$KAFKA_SECURE_PORT not open"; }
      sleep 0.25
    done
    if ! create_acls; then
      stop_pid "$pid"  # a secure broker without its ACLs is of no use to anyone
      rm -f "$PID_FILE"
      die "could not create the ACLs (see above); broker stopped"
    fi
    log "SASL_SSL listener on 127.0.0.1:$KAFKA_SECURE_PORT; CA, passwords, client env in $SECURE_DIR"
  fi
  log "Kafka $KAFKA_VERSION ready on 127.0.0.1:$KAFKA_PORT (pid $pid) in $(elapsed_since "$t0") s"
}

stop_pid() { # $1 = pid: SIGTERM, wait STOP_TIMEOUT s, then SIGKILL
  local pid="$1" i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < STOP_TIMEOUT * 4; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.25
  done
  log "pid $pid still alive after ${STOP_TIMEOUT} s; sending SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 40; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.25
  done
  die "could not kill pid $pid"
}

cmd_stop() {
  local pid t0
  take_lock 9 "port-$KAFKA_PORT"
  if ! pid="$(running_pid)"; then
    rm -f "$PID_FILE"
    if port_open "$KAFKA_PORT"; then
      log "no broker started by this script on port $KAFKA_PORT, but something listens there; leaving it alone"
    else
      log "Kafka not running on port $KAFKA_PORT"
    fi
    return 0
  fi
  t0="$(now)"
  log "stopping Kafka on 127.0.0.1:$KAFKA_PORT (pid $pid) ..."
  stop_pid "$pid"
  rm -f "$PID_FILE"
  log "stopped in $(elapsed_since "$t0") s"
}

cmd_status() {
  local pid
  if pid="$(running_pid)"; then
    if port_open "$KAFKA_PORT"; then
      log "running: Kafka $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT (pid $pid), data $DATA_DIR, log $LOG_FILE"
    else
      log "starting (pid $pid alive, port $KAFKA_PORT not accepting yet), log $LOG_FILE"
    fi
    return 0
  fi
  if port_open "$KAFKA_PORT"; then
    log "not started by this script, but port $KAFKA_PORT accepts connections (another broker?)"
  else
    log "stopped (port $KAFKA_PORT)"
  fi
  return 3
}

cmd_reset() {
  cmd_stop
  take_lock 9 "port-$KAFKA_PORT"
  rm -rf "$DATA_DIR"
  log "wiped $DATA_DIR"
}

usage() {
  sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

case "${1:-}" in
  fetch)  cmd_fetch ;;
  start)  cmd_start ;;
  stop)   cmd_stop ;;
  status) cmd_status ;;
  reset)  cmd_reset ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
