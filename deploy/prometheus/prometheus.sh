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
NAME=Prometheus
ENV_PREFIX=PROMETHEUS
PACKAGE=prometheus
READY_NOTE="targets $TARGETS"
# shellcheck source=../lib/daemon.sh
source "$SCRIPT_DIR/../lib/daemon.sh"

check_common_env
[[ "$SCRAPE_INTERVAL" =~ ^[0-9]+(ms|s|m)$ ]] \
  || die "PROMETHEUS_SCRAPE_INTERVAL must be a duration like 1s or 15s, got '$SCRAPE_INTERVAL'"

render_config() {
  local timeout="$SCRAPE_INTERVAL"  # may not exceed the interval
  [[ -f "$TARGETS" ]] || printf '[]\n' >"$TARGETS"
  sed -e "s|@SCRAPE_INTERVAL@|$SCRAPE_INTERVAL|g" -e "s|@SCRAPE_TIMEOUT@|$timeout|g" \
      -e "s|@TARGETS_FILE@|$TARGETS|g" "$SCRIPT_DIR/prometheus.yml.in" >"$CONFIG.tmp"
  mv -f "$CONFIG.tmp" "$CONFIG"
}

daemon_args() {
  printf '%s\n' "--storage.tsdb.path=$CACHE_DIR/data"
  printf '%s\n' "--storage.tsdb.retention.time=1d"
  printf '%s\n' "--web.listen-address=127.0.0.1:$PORT"
}

daemon_main "$@"
