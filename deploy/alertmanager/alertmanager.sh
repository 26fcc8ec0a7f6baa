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
NAME=Alertmanager
ENV_PREFIX=ALERTMANAGER
PACKAGE=prometheus-alertmanager
READY_NOTE="receiver $WEBHOOK_URL"
# shellcheck source=../lib/daemon.sh
source "$SCRIPT_DIR/../lib/daemon.sh"

check_common_env
for duration in "$GROUP_WAIT" "$GROUP_INTERVAL"; do
  [[ "$duration" =~ ^[0-9]+(ms|s|m|h)$ ]] || die "group wait/interval must be durations like 1s, got '$duration'"
done
[[ "$WEBHOOK_URL" =~ ^https?://[^[:space:]\"]+$ ]] || die "ALERTMANAGER_WEBHOOK_URL must be an http(s) URL, got '$WEBHOOK_URL'"

render_config() {
  sed -e "s|@GROUP_WAIT@|$GROUP_WAIT|g" -e "s|@GROUP_INTERVAL@|$GROUP_INTERVAL|g" \
      -e "s|@WEBHOOK_URL@|$WEBHOOK_URL|g" "$SCRIPT_DIR/alertmanager.yml.in" >"$CONFIG.tmp"
  mv -f "$CONFIG.tmp" "$CONFIG"
}

daemon_args() {
  # --cluster.listen-address= : no gossip port, one instance is all development needs
  printf '%s\n' "--storage.path=$CACHE_DIR/data"
  printf '%s\n' "--web.listen-address=127.0.0.1:$PORT"
  printf '%s\n' "--cluster.listen-address="
}

daemon_main "$@"
