#!/usr/bin/env bash
# FleetPulse development Kubernetes API server: a REAL kube-apiserver + etcd on 127.0.0.1, built
# from the Kubernetes module on the Go module proxy (no Docker, no kubelet, no controllers).
#
#   deploy/kubernetes/kube.sh build    build kube-apiserver once per version (cached, ~4-5 min on 2 cores)
#   deploy/kubernetes/kube.sh start    build if needed, start etcd + apiserver, write the kubeconfig
#   deploy/kubernetes/kube.sh stop     stop both (only the pids this script recorded)
#   deploy/kubernetes/kube.sh status   exit 0 when running and ready, 3 when not
#   deploy/kubernetes/kube.sh env      print KUBECONFIG=... for the running server
#
# Env: KUBE_API_PORT (default 26443), KUBE_ETCD_PORT (default 23790; peers use +1),
#      KUBE_VERSION (default v1.34.4), KUBE_ETCD (system = /usr/bin/etcd from Debian's
#      etcd-server, the default; or a path to an etcd binary), KUBE_AUTHZ (default RBAC;
#      AlwaysAllow for a quick look), KUBE_NICE (default 10), GO (default: go on PATH),
#      KUBE_START_TIMEOUT (seconds, default 60).
# The binary is cached in ~/.cache/fleetpulse/kube/<version>/ (outside the work tree, so every
# clone on this machine reuses it); the run dir (etcd data, PKI, tokens, logs, kubeconfig) is
# <repo>/.cache/kube/<API port>/ and is fresh on every start.
# Tokens (static token file, like a small cluster's bootstrap): `admin` (system:masters) in the
# kubeconfig, plus extra users listed in KUBE_EXTRA_TOKENS="name:group[,group] ..." whose tokens
# land in <run dir>/token-<name> - tests bind RBAC roles to them to check least privilege.
# Caveats (only the apiserver runs): no default ServiceAccount (start creates default/default),
# no PDB status (tests write it through the status subresource), pods deleted or evicted stay
# Terminating until deleted with grace 0, nodes never change by themselves.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd -P)"
KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
API_PORT="${KUBE_API_PORT:-26443}"
ETCD_PORT="${KUBE_ETCD_PORT:-23790}"
ETCD_PEER_PORT=$((ETCD_PORT + 1))
AUTHZ="${KUBE_AUTHZ:-RBAC}"
NICE="${KUBE_NICE:-10}"
START_TIMEOUT="${KUBE_START_TIMEOUT:-60}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
BIN_CACHE="${KUBE_CACHE:-$HOME/.cache/fleetpulse/kube}/$KUBE_VERSION"
APISERVER="$BIN_CACHE/kube-apiserver"
RUN_DIR="$REPO_ROOT/.cache/kube/$API_PORT"
PKI="$RUN_DIR/pki"

log() { printf 'kube.sh: %s\n' "$*"; }
die() { printf 'kube.sh: error: %s\n' "$*" >&2; exit 1; }
is_port() { [[ "$1" =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 <= 65535 )); }
is_port "$API_PORT" || die "KUBE_API_PORT must be a port number (1-65535), got '$API_PORT'"
is_port "$ETCD_PORT" || die "KUBE_ETCD_PORT must be a port number (1-65535), got '$ETCD_PORT'"
[[ "$KUBE_VERSION" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "KUBE_VERSION must look like v1.34.4, got '$KUBE_VERSION'"

etcd_bin() {
  local e="${KUBE_ETCD:-system}"
  if [[ "$e" == system ]]; then command -v etcd || true; else echo "$e"; fi
}

# --- build ---------------------------------------------------------------------------------------

cmd_build() {
  [[ -x "$APISERVER" ]] && { log "kube-apiserver $KUBE_VERSION cached at $APISERVER"; return 0; }
  [[ -x "$GO" ]] || die "go not found: install Go >= 1.24 or set GO"
  mkdir -p "$BIN_CACHE"
  # one build at a time: several test runs on one machine share the cache
  exec 9>"$BIN_CACHE/.build.lock"; flock 9
  [[ -x "$APISERVER" ]] && { log "kube-apiserver $KUBE_VERSION built meanwhile at $APISERVER"; return 0; }
  local t0 src moddir; t0=$(date +%s)
  log "building kube-apiserver $KUBE_VERSION from the Go module proxy (first time ~4-5 min on 2 cores, ~1.8 GB RSS)"
  moddir="$("$GO" mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$moddir" ]] || die "go mod download k8s.io/kubernetes@$KUBE_VERSION failed (check 'go env GOPROXY')"
  src="$BIN_CACHE/src"
  rm -rf "$src"; cp -r "$moddir" "$src"; chmod -R u+w "$src"
  (
    cd "$src"
    # The module zip has no staging/ tree: drop its ./staging replaces and pin every staging
    # module (required as v0.0.0) to its published v0.MINOR.PATCH release instead.
    rm -rf go.work go.work.sum vendor
    local edits=() m stage="v0.${KUBE_VERSION#v1.}" major minor
    for m in $(awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}' go.mod); do edits+=("-dropreplace=$m"); done
    for m in $(awk '$2=="v0.0.0" {print $1}' go.mod); do edits+=("-require=$m@$stage"); done
    "$GO" mod edit "${edits[@]}"
    IFS=. read -r major minor _ <<<"${KUBE_VERSION#v}"
    local V=k8s.io/component-base/version  # without these /version says v0.0.0-master
    CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod" nice -n "$NICE" "$GO" build -trimpath \
      -ldflags="-s -w -X $V.gitVersion=$KUBE_VERSION -X $V.gitMajor=$major -X $V.gitMinor=$minor -X $V.gitTreeState=clean" \
      -o "$APISERVER.tmp" ./cmd/kube-apiserver
  )
  mv "$APISERVER.tmp" "$APISERVER"
  rm -rf "$src"
  log "built $APISERVER ($(du -h "$APISERVER" | cut -f1)) in $(( $(date +%s) - t0 )) s"
}

# --- run -----------------------------------------------------------------------------------------

# the recorded pid, alive, and its command line names our run dir (guards against pid reuse)
running_pid() {
  local f="$RUN_DIR/$1.pid" pid
  pid="$(cat "$f" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$RUN_DIR" || return 1
  printf '%s\n' "$pid"
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
admin_token() { cut -d, -f1 <"$PKI/tokens.csv" | head -n 1; }
ready() {
  curl -fsS -o /dev/null --max-time 2 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(admin_token)" \
    "https://127.0.0.1:$API_PORT/readyz" 2>/dev/null
}

gen_pki() {
  mkdir -p "$PKI"; chmod 700 "$PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -days 365 \
    -subj "/CN=fleetpulse-dev-ca" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$PKI/apiserver.key" -out "$PKI/apiserver.csr" \
    -subj "/CN=kube-apiserver" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' \
    >"$PKI/ext.cnf"
  openssl x509 -req -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -out "$PKI/apiserver.crt" -days 365 -extfile "$PKI/ext.cnf" 2>/dev/null
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  # static tokens: token,user,uid,"group1,group2"
  echo "$(openssl rand -hex 24),admin,admin,system:masters" >"$PKI/tokens.csv"
  local spec name groups tok
  for spec in ${KUBE_EXTRA_TOKENS:-}; do
    name="${spec%%:*}"; groups="${spec#*:}"; [[ "$groups" == "$spec" ]] && groups=""
    [[ "$name" =~ ^[a-z0-9-]+$ ]] || die "KUBE_EXTRA_TOKENS: bad user name '$name'"
    tok="$(openssl rand -hex 24)"
    echo "$tok,$name,$name,\"$groups\"" >>"$PKI/tokens.csv"
    printf '%s' "$tok" >"$RUN_DIR/token-$name"; chmod 600 "$RUN_DIR/token-$name"
  done
}

write_kubeconfig() {
  cat >"$RUN_DIR/kubeconfig" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: fleetpulse-dev
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: admin
  user:
    token: $(admin_token)
contexts:
- name: fleetpulse-dev
  context: {cluster: fleetpulse-dev, user: admin, namespace: default}
current-context: fleetpulse-dev
KCFG
  chmod 600 "$RUN_DIR/kubeconfig"
}

stop_one() {
  local pid i
  pid="$(running_pid "$1")" || { rm -f "$RUN_DIR/$1.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$RUN_DIR/$1.pid"
  log "stopped $1 (pid $pid)"
}

cmd_stop() { stop_one apiserver; stop_one etcd; }

wait_for() { # what check pidname
  local what="$1" check="$2" name="$3" deadline=$(( $(date +%s) + START_TIMEOUT )) pid
  pid="$(cat "$RUN_DIR/$name.pid")"
  until $check; do
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$RUN_DIR/$name.log" >&2; cmd_stop; die "$what exited during startup (see $RUN_DIR/$name.log)"; }
    (( $(date +%s) < deadline )) || { tail -n 30 "$RUN_DIR/$name.log" >&2; cmd_stop; die "$what not ready after ${START_TIMEOUT} s"; }
    sleep 0.1
  done
}
etcd_ready() { curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null; }

cmd_start() {
  if running_pid apiserver >/dev/null && ready; then log "already running on https://127.0.0.1:$API_PORT"; cmd_env; return 0; fi
  cmd_stop >/dev/null
  [[ -x "$APISERVER" ]] || cmd_build
  local etcd; etcd="$(etcd_bin)"
  [[ -n "$etcd" && -x "$etcd" ]] || die "etcd not found: apt-get install -y etcd-server (deploy/system-deps.sh) or set KUBE_ETCD=/path/to/etcd"
  command -v openssl >/dev/null || die "openssl not found"
  local p; for p in "$ETCD_PORT" "$ETCD_PEER_PORT" "$API_PORT"; do port_open "$p" && die "port $p is in use; set KUBE_ETCD_PORT / KUBE_API_PORT"; done
  rm -rf "$RUN_DIR"; mkdir -p "$RUN_DIR"
  gen_pki
  local launcher=(); command -v setsid >/dev/null && launcher=(setsid)
  # etcd reads every ETCD_* variable as a flag: start it with none of them
  local unset_etcd=() v; for v in $(compgen -e | grep '^ETCD_' || true); do unset_etcd+=(-u "$v"); done
  "${launcher[@]}" env "${unset_etcd[@]}" "$etcd" --name fleetpulse-dev --data-dir "$RUN_DIR/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "fleetpulse-dev=http://127.0.0.1:$ETCD_PEER_PORT" </dev/null >"$RUN_DIR/etcd.log" 2>&1 &
  echo $! >"$RUN_DIR/etcd.pid"
  wait_for etcd etcd_ready etcd
  "${launcher[@]}" "$APISERVER" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" --etcd-prefix=/registry \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --cert-dir="$RUN_DIR/certs" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --token-auth-file="$PKI/tokens.csv" --authorization-mode="$AUTHZ" \
    --service-cluster-ip-range=10.0.0.0/24 </dev/null >"$RUN_DIR/apiserver.log" 2>&1 &
  echo $! >"$RUN_DIR/apiserver.pid"
  write_kubeconfig
  wait_for kube-apiserver ready apiserver
  # no controller-manager: create the default ServiceAccount so Pods pass admission
  curl -fsS -o /dev/null --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(admin_token)" -X POST \
    -H 'Content-Type: application/json' -d '{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"default"}}' \
    "https://127.0.0.1:$API_PORT/api/v1/namespaces/default/serviceaccounts" 2>/dev/null || true
  log "kube-apiserver $KUBE_VERSION ready on https://127.0.0.1:$API_PORT (authz $AUTHZ, etcd $("$etcd" --version 2>/dev/null | head -n 1 | awk '{print $NF}'))"
  cmd_env
}

cmd_status() {
  if running_pid apiserver >/dev/null && running_pid etcd >/dev/null && ready; then
    log "running on https://127.0.0.1:$API_PORT"; cmd_env; return 0
  fi
  log "not running (port $API_PORT)"; return 3
}

cmd_env() { echo "KUBECONFIG=$RUN_DIR/kubeconfig"; }

case "${1:-}" in
  build) cmd_build ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  -h|--help|help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
