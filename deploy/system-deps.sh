#!/usr/bin/env bash
# Install the system packages FleetPulse's tests need, only when missing (Debian/Ubuntu, root).
set -euo pipefail
need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
command -v go >/dev/null || need+=(golang-go)  # deploy/toxiproxy: builds Toxiproxy (Go 1.22+)
command -v openssl >/dev/null || need+=(openssl)  # kafka.sh secure profile: per-run CA
command -v prometheus >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v chromium >/dev/null || need+=(chromium)
command -v etcd >/dev/null || need+=(etcd-server)  # deploy/kubernetes/kube.sh: the API server's store
# deploy/slurm/slurm.sh: a real slurmctld + slurmd (Debian's 22.05) with munge for their auth
[ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need+=(slurmd)
command -v sbatch >/dev/null || need+=(slurm-client)
[ -x /usr/sbin/munged ] || need+=(munge)
# deploy/postgres/postgres.sh: the Iceberg lake's PostgreSQL catalog (initdb + pg_ctl, no systemd)
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null || need+=(postgresql)
command -v go >/dev/null || [ -x /usr/local/go/bin/go ] \
  || echo "deploy/kubernetes: Go >= 1.24 is needed to build kube-apiserver and helm (go.dev/dl)" >&2
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "FleetPulse tests need: ${need[*]} — install them with your package manager (apt-get install -y ${need[*]})" >&2
  exit 1
fi
echo "installing system packages: ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
