#!/usr/bin/env bash
# `make kube-demo`: FleetPulse closing the loop on a real (development) Kubernetes API server.
#
# Starts Kafka and the kube-apiserver (deploy/kafka/kafka.sh, deploy/kubernetes/kube.sh; a
# running one is reused and left running), creates the simulator's GPU nodes as Node objects
# with pods on them, runs `fleetpulse watch kubernetes`, `fleetpulse worker` and
# `fleetpulse actuate kubernetes` LIVE (dry run off on purpose: this API server is a local one
# with nothing on it) and `fleetpulse simulate --to kafka --start-ms now --realtime` with a
# GPU falling off the bus (XID 79) on one node, then prints step by step what happens to that
# node: cordoned, tainted, the FleetPulseUnhealthy condition, its pods evicted, a repair
# requested; then a person releases it (`fleetpulse node release`: the GPU reseated by hand)
# and the actions and node events are printed. Everything it started is stopped at the end.
#
# Env: KAFKA_PORT (default 19092), KUBE_API_PORT / KUBE_ETCD_PORT (26443 / 23790),
#      KUBE_DEMO_NODE (default fp-us-central1-h100-train-000), KUBE_DEMO_DIR (where logs go,
#      default .cache/kube-demo). About 2 minutes; the first run builds the API server (~5 min).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
bin="$root/.venv/bin"
export KAFKA_PORT="${KAFKA_PORT:-19092}" KUBE_API_PORT="${KUBE_API_PORT:-26443}" KUBE_ETCD_PORT="${KUBE_ETCD_PORT:-23790}"
node="${KUBE_DEMO_NODE:-fp-us-central1-h100-train-000}"
work="${KUBE_DEMO_DIR:-$root/.cache/kube-demo}"
rm -rf "$work"; mkdir -p "$work"
step() { printf '\n== %s\n' "$*"; }

started=() pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [[ -f "$work/fleet/inventory.jsonl" ]] && "$bin/python" deploy/kubernetes/kube_demo.py cleanup "$work/fleet/inventory.jsonl" || true
  for service in "${started[@]}"; do bash "deploy/$service" stop >/dev/null || true; done
}
trap cleanup EXIT

step "Kafka on 127.0.0.1:$KAFKA_PORT and kube-apiserver on 127.0.0.1:$KUBE_API_PORT"
if ! bash deploy/kafka/kafka.sh status >/dev/null 2>&1; then bash deploy/kafka/kafka.sh start; started+=(kafka/kafka.sh); fi
if ! bash deploy/kubernetes/kube.sh status >/dev/null 2>&1; then bash deploy/kubernetes/kube.sh start >/dev/null; started+=(kubernetes/kube.sh); fi
kubeconfig="$(bash deploy/kubernetes/kube.sh env | cut -d= -f2)"

# Every process reads the same settings from the environment. Live on purpose; the health
# machine's clocks shortened so the story fits in a minute (a quiet node's clock moves with
# its heartbeat findings; probation after a repair).
export FLEETPULSE_KAFKA__BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
export FLEETPULSE_KAFKA__TOPIC_PREFIX="demo$(date +%s)" FLEETPULSE_KAFKA__PARTITIONS=2
export FLEETPULSE_KUBERNETES__KUBECONFIG="$kubeconfig" FLEETPULSE_KUBERNETES__CLUSTER=fp-us-central1
export FLEETPULSE_POLICY__DRY_RUN=false FLEETPULSE_METRICS__PORT=0
export FLEETPULSE_DETECT__HEARTBEAT_S=2 FLEETPULSE_DETECT__XID_CLEAR_S=5 FLEETPULSE_HEALTH__PROBATION_S=5
export FLEETPULSE_WORKER__DATADIR="$work/worker" PYTHONUNBUFFERED=1
unset FLEETPULSE_CONFIG KUBECONFIG  # the local API server's kubeconfig only, never yours
sim=(--gpu-nodes 4 --tpu-slices 0 --clusters 1 --interval 2 --seed 5 --no-random-faults --no-diurnal --quiet)

step "topics ($FLEETPULSE_KAFKA__TOPIC_PREFIX.*)"
"$bin/fleetpulse" topics create | tail -n 1

step "the simulator's GPU nodes as Node objects, two pods on each"
"$bin/fleetpulse" simulate --to jsonl --out "$work/fleet" --duration 10 "${sim[@]}" >/dev/null
"$bin/python" deploy/kubernetes/kube_demo.py nodes "$work/fleet/inventory.jsonl"

step "watcher, worker and actuator (logs in $work)"
"$bin/fleetpulse" watch kubernetes >"$work/watcher.log" 2>&1 & pids+=($!)
"$bin/fleetpulse" worker --loglevel warning >"$work/worker.log" 2>&1 & pids+=($!)
"$bin/fleetpulse" actuate kubernetes >"$work/actuator.log" 2>&1 & pids+=($!)
"$bin/python" deploy/kubernetes/kube_demo.py ready "$work/watcher.log" "$work/worker.log" "$work/actuator.log"

step "fleetpulse simulate --to kafka --start-ms now --realtime: XID 79 on $node at 20 s"
"$bin/fleetpulse" simulate --to kafka --start-ms now --realtime --duration 90 "${sim[@]}" \
  --inject "G1@20:$node:3" >"$work/simulate.log" 2>&1 & pids+=($!)
"$bin/python" deploy/kubernetes/kube_demo.py follow "$node" --until repair --timeout 90

step "a person reseats the GPU and releases the node"
"$bin/fleetpulse" node release "$node" --reason "kube-demo: GPU reseated by hand" | tail -n 2
"$bin/python" deploy/kubernetes/kube_demo.py follow "$node" --until released --timeout 30

step "what FleetPulse decided and what the cluster reported"
sleep 2
"$bin/python" deploy/kubernetes/kube_demo.py events
