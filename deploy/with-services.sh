#!/usr/bin/env bash
# Start the real services the tests need, run the given command, stop them even on failure.
# Services started here: Apache Kafka (KRaft, deploy/kafka/kafka.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KAFKA_PORT="${KAFKA_PORT:-19092}"
export FLEETPULSE_KAFKA__BOOTSTRAP="127.0.0.1:${KAFKA_PORT}"
started=()
cleanup() {
  for service in "${started[@]}"; do bash "$root/deploy/$service" stop || true; done
}
trap cleanup EXIT
if ! bash "$root/deploy/kafka/kafka.sh" status >/dev/null 2>&1; then
  bash "$root/deploy/kafka/kafka.sh" start
  started+=(kafka/kafka.sh)
fi
"$@"
