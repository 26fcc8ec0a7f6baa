#!/usr/bin/env bash
# Start the real services the tests need, run the given command, stop them even on failure.
# Services started here: Apache Kafka (KRaft, deploy/kafka/kafka.sh), an S3-API object store
# (s3proxy, deploy/s3/s3.sh: the Iceberg lake's tests find it through S3_PORT, S3_ACCESS_KEY
# and S3_SECRET_KEY), PostgreSQL (deploy/postgres/postgres.sh: the Iceberg catalog shared by
# several writers; PG_PORT, PG_USER, PG_PASSWORD, PG_DATABASE) and a Kubernetes API server
# with etcd (deploy/kubernetes/kube.sh), and Slurm (slurmctld, slurmd, munged: deploy/slurm/slurm.sh;
# tests find it through SLURM_CONF). helm (deploy/kubernetes/helm.sh) and Toxiproxy
# (deploy/toxiproxy/toxiproxy.sh; the network fault tests start their own) are only built here.
# The Go builds happen here, once per machine (cached in ~/.cache/fleetpulse), not inside a timed test.
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
# the credentials s3.sh gives s3proxy (its defaults), for the tests to sign with
export S3_PORT="${S3_PORT:-19645}" S3_ACCESS_KEY="${S3_ACCESS_KEY:-fleetpulse}"
export S3_SECRET_KEY="${S3_SECRET_KEY:-fleetpulse-secret}"
if ! bash "$root/deploy/s3/s3.sh" status >/dev/null 2>&1; then
  bash "$root/deploy/s3/s3.sh" start
  started+=(s3/s3.sh)
fi
# PostgreSQL (deploy/postgres/postgres.sh): the Iceberg catalog several writers share; the tests
# find it through PG_PORT, PG_USER, PG_PASSWORD and PG_DATABASE (postgres.sh's defaults)
export PG_PORT="${PG_PORT:-19648}" PG_USER="${PG_USER:-fleetpulse}"
export PG_PASSWORD="${PG_PASSWORD:-fleetpulse-secret}" PG_DATABASE="${PG_DATABASE:-fleetpulse_catalog}"
if ! bash "$root/deploy/postgres/postgres.sh" status >/dev/null 2>&1; then
  bash "$root/deploy/postgres/postgres.sh" start
  started+=(postgres/postgres.sh)
fi
bash "$root/deploy/toxiproxy/toxiproxy.sh" fetch
export KUBE_API_PORT="${KUBE_API_PORT:-26443}" KUBE_ETCD_PORT="${KUBE_ETCD_PORT:-23790}"
bash "$root/deploy/kubernetes/helm.sh" build
if ! bash "$root/deploy/kubernetes/kube.sh" status >/dev/null 2>&1; then
  bash "$root/deploy/kubernetes/kube.sh" start
  started+=(kubernetes/kube.sh)
fi
export SLURM_CTLD_PORT="${SLURM_CTLD_PORT:-16817}" SLURM_NODE_PORT="${SLURM_NODE_PORT:-17001}"
if ! bash "$root/deploy/slurm/slurm.sh" status >/dev/null 2>&1; then
  bash "$root/deploy/slurm/slurm.sh" start
  started+=(slurm/slurm.sh)
fi
SLURM_CONF="$(bash "$root/deploy/slurm/slurm.sh" env)"
export SLURM_CONF="${SLURM_CONF#SLURM_CONF=}"
"$@"
