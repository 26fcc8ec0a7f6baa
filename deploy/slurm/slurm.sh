#!/usr/bin/env bash
# FleetPulse development Slurm: Debian's REAL slurmctld + several slurmd + munged on one host,
# started as root without systemd (no Docker, no cgroups, no slurmdbd).
#
#   deploy/slurm/slurm.sh start    munged, slurmctld, one `slurmd -N <node>` per node; wait until idle
#   deploy/slurm/slurm.sh stop     stop them (only the pids this script recorded)
#   deploy/slurm/slurm.sh status   exit 0 when every daemon runs and the controller answers, 3 when not
#   deploy/slurm/slurm.sh env      print SLURM_CONF=... for the running cluster
#
# Env: SLURM_CTLD_PORT (default 16817), SLURM_NODE_PORT (the first node's slurmd port, default
#      17001; node i listens on SLURM_NODE_PORT+i-1), SLURM_NODES (default 4: gpu-1 … gpu-N),
#      SLURM_SLURMD_TIMEOUT (seconds before a silent node is DOWN "Not responding", default 6;
#      Slurm marks it about one ping cycle later), SLURM_START_TIMEOUT (seconds, default 30).
# Everything lives in a run dir that is fresh on every start: /tmp/fleetpulse-slurm-<ctld port>/
# (munged refuses a key, socket or log under a group- or world-writable path, and /tmp's own
# sticky bit is the one exception it allows). Every node says it has 8 GPUs (Gres=gpu:h100:8;
# gres.conf File= eight links to /dev/null): Slurm counts them, nothing touches them. The reboot program is a stand-in
# (fake-reboot.sh beside this script): it restarts the calling slurmd with `-b` ("the node
# rebooted"), so `scontrol reboot` works without rebooting the machine. slurmd binds 0.0.0.0:<port>
# (Slurm has no bind-address for it); nothing here sends anything off the host.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
CTLD_PORT="${SLURM_CTLD_PORT:-16817}"
NODE_PORT="${SLURM_NODE_PORT:-17001}"
NODES="${SLURM_NODES:-4}"
SLURMD_TIMEOUT="${SLURM_SLURMD_TIMEOUT:-6}"
START_TIMEOUT="${SLURM_START_TIMEOUT:-30}"
RUN_DIR="/tmp/fleetpulse-slurm-$CTLD_PORT"
CONF="$RUN_DIR/slurm.conf"

log() { printf 'slurm.sh: %s\n' "$*"; }
die() { printf 'slurm.sh: error: %s\n' "$*" >&2; exit 1; }
is_port() { [[ "$1" =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 <= 65535 )); }
is_port "$CTLD_PORT" || die "SLURM_CTLD_PORT must be a port number (1-65535), got '$CTLD_PORT'"
is_port "$NODE_PORT" || die "SLURM_NODE_PORT must be a port number (1-65535), got '$NODE_PORT'"
[[ "$NODES" =~ ^[0-9]+$ ]] && (( NODES >= 1 && NODES <= 64 )) || die "SLURM_NODES must be 1-64, got '$NODES'"
[[ "$SLURMD_TIMEOUT" =~ ^[0-9]+$ ]] || die "SLURM_SLURMD_TIMEOUT must be whole seconds, got '$SLURMD_TIMEOUT'"
[[ "$START_TIMEOUT" =~ ^[0-9]+$ ]] || die "SLURM_START_TIMEOUT must be whole seconds, got '$START_TIMEOUT'"
LAST_PORT=$((NODE_PORT + NODES - 1))
is_port "$LAST_PORT" || die "SLURM_NODE_PORT + SLURM_NODES runs past 65535"

# the recorded pid, alive, and its command line names our run dir (guards against pid reuse)
running_pid() {
  local f="$RUN_DIR/run/$1.pid" pid
  pid="$(cat "$f" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$RUN_DIR" || return 1
  printf '%s\n' "$pid"
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "gpu-$i"; done; }
controller_answers() { SLURM_CONF="$CONF" timeout 5 scontrol ping 2>/dev/null | grep -q UP; }
all_idle() {
  local states
  states="$(SLURM_CONF="$CONF" timeout 5 sinfo -h -N -o '%T' 2>/dev/null)" || return 1
  [[ "$(grep -cx idle <<<"$states")" == "$NODES" ]]
}

render_conf() {
  local host; host="$(hostname)"  # SlurmctldHost and NodeHostname must be this host's name
  cat >"$CONF" <<CONF
# written by deploy/slurm/slurm.sh; fresh on every start
ClusterName=fplab
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$NODE_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$RUN_DIR/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$RUN_DIR/state
SlurmdSpoolDir=$RUN_DIR/spool/%n
SlurmctldPidFile=$RUN_DIR/run/slurmctld.pid
SlurmdPidFile=$RUN_DIR/run/slurmd-%n.pid
SlurmctldLogFile=$RUN_DIR/log/slurmctld.log
SlurmdLogFile=$RUN_DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmdTimeout=$SLURMD_TIMEOUT
MessageTimeout=5
MpiDefault=none
RebootProgram=$SCRIPT_DIR/fake-reboot.sh
ResumeTimeout=60
NodeName=gpu-[1-$NODES] NodeAddr=127.0.0.1 NodeHostname=$host CPUs=1 RealMemory=100 Gres=gpu:h100:8 Feature=h100 State=UNKNOWN Port=[$NODE_PORT-$LAST_PORT]
PartitionName=batch Nodes=gpu-[1-$NODES] Default=YES MaxTime=INFINITE State=UP
CONF
  # Debian's 22.05 counts a gpu GRES only through File= (Count= alone reports 0, and one
  # /dev/null is one GPU): eight links to /dev/null, character devices nothing will touch
  mkdir -p "$RUN_DIR/dev"
  local i; for ((i = 0; i < 8; i++)); do ln -s /dev/null "$RUN_DIR/dev/nvidia$i"; done
  echo "NodeName=gpu-[1-$NODES] Name=gpu Type=h100 File=$RUN_DIR/dev/nvidia[0-7]" >"$RUN_DIR/gres.conf"
}

start_munge() {
  local m="$RUN_DIR/munge"
  mkdir -p "$m"
  dd if=/dev/urandom of="$m/munge.key" bs=1 count=128 status=none
  chown -R munge:munge "$m"; chmod 755 "$m"; chmod 400 "$m/munge.key"  # clients need x on the socket dir
  runuser -u munge -- /usr/sbin/munged --socket="$m/munge.socket" --key-file="$m/munge.key" \
    --pid-file="$m/munged.pid" --log-file="$m/munged.log" --seed-file="$m/munged.seed"
  cp "$m/munged.pid" "$RUN_DIR/run/munged.pid"
}

stop_all() { # TERM every named daemon, wait up to 5 s for all, then KILL what is left
  local name pid pids=() i alive
  for name in "$@"; do
    pid="$(running_pid "$name")" && { kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); }
    rm -f "$RUN_DIR/run/$name.pid"
  done
  for ((i = 0; i < 50; i++)); do
    alive=0; for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    (( alive )) || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

cmd_stop() {
  local i jobs
  # jobs first, while the controller runs: their steps (slurmstepd) would outlive slurmd
  if running_pid slurmctld >/dev/null; then
    jobs="$(SLURM_CONF="$CONF" timeout 5 squeue -h -o %i 2>/dev/null || true)"
    if [[ -n "$jobs" ]]; then
      SLURM_CONF="$CONF" timeout 5 scancel $jobs 2>/dev/null || true
      for ((i = 0; i < 30; i++)); do
        [[ -z "$(SLURM_CONF="$CONF" timeout 5 squeue -h -o %i 2>/dev/null)" ]] && break; sleep 0.1
      done
    fi
  fi
  # the Slurm daemons together (each may take seconds to save its state), munged last
  stop_all $(node_names | sed 's/^/slurmd-/') slurmctld
  stop_all munged
  log "stopped (run dir $RUN_DIR)"
}

cmd_start() {
  if cmd_status >/dev/null 2>&1; then log "already running on port $CTLD_PORT"; cmd_env; return 0; fi
  local bin; for bin in slurmctld slurmd munged scontrol sinfo sbatch; do
    command -v "$bin" >/dev/null || [[ -x "/usr/sbin/$bin" ]] \
      || die "$bin not found: apt-get install -y slurmctld slurmd slurm-client munge (deploy/system-deps.sh)"
  done
  [[ "$(id -u)" == 0 ]] || die "slurmd and slurmctld run as root here (SlurmUser=root); run as root"
  cmd_stop >/dev/null
  local p; for p in "$CTLD_PORT" $(seq "$NODE_PORT" "$LAST_PORT"); do
    port_open "$p" && die "port $p is in use; set SLURM_CTLD_PORT / SLURM_NODE_PORT"
  done
  rm -rf "$RUN_DIR"; mkdir -p "$RUN_DIR"/{state,spool,run,log}; chmod 755 "$RUN_DIR"
  render_conf
  start_munge
  local t0; t0=$(date +%s%N)
  export SLURM_CONF="$CONF"
  /usr/sbin/slurmctld -f "$CONF" -i </dev/null >"$RUN_DIR/log/slurmctld.out" 2>&1
  local n; for n in $(node_names); do
    mkdir -p "$RUN_DIR/spool/$n"
    /usr/sbin/slurmd -f "$CONF" -N "$n" </dev/null >"$RUN_DIR/log/slurmd-$n.out" 2>&1
  done
  local deadline=$(( $(date +%s) + START_TIMEOUT ))
  until all_idle; do
    if (( $(date +%s) >= deadline )); then
      tail -n 20 "$RUN_DIR/log/slurmctld.log" >&2 || true
      cmd_stop; die "not every node idle after ${START_TIMEOUT} s (see $RUN_DIR/log)"
    fi
    sleep 0.2
  done
  log "slurmctld $(slurmctld -V | awk '{print $2}') on port $CTLD_PORT, $NODES nodes idle (slurmd ports $NODE_PORT-$LAST_PORT) in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  cmd_env
}

cmd_status() {
  local name
  for name in munged slurmctld $(node_names | sed 's/^/slurmd-/'); do
    running_pid "$name" >/dev/null || { log "not running ($name, port $CTLD_PORT)"; return 3; }
  done
  controller_answers || { log "slurmctld on port $CTLD_PORT does not answer"; return 3; }
  log "running on port $CTLD_PORT"; cmd_env
}

cmd_env() { echo "SLURM_CONF=$CONF"; }

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  -h|--help|help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
