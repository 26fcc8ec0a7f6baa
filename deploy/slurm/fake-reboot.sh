#!/usr/bin/env bash
# RebootProgram stand-in for deploy/slurm/slurm.sh: `scontrol reboot` runs this from the node's
# slurmd. It finds that slurmd (walking up from its own parent), stops it and starts it again
# with -b ("report the node rebooted now"), so Slurm sees a reboot and a new boot time without
# the machine rebooting. Detached: it outlives the slurmd it stops.
set -euo pipefail
pid=$PPID
while [[ "$pid" -gt 1 && "$(cat "/proc/$pid/comm" 2>/dev/null)" != slurmd ]]; do
  pid="$(awk '/^PPid:/ {print $2}' "/proc/$pid/status")"
done
[[ "$pid" -gt 1 ]] || { echo "fake-reboot.sh: no slurmd above pid $$" >&2; exit 1; }
mapfile -d '' args <"/proc/$pid/cmdline"
setsid bash -c '
  pid=$1; shift
  sleep 1  # let slurmd answer the reboot request first
  kill -TERM "$pid"; for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  args=(); for a in "$@"; do [[ "$a" == -b ]] || args+=("$a"); done
  exec "${args[0]}" -b "${args[@]:1}"
' fake-reboot "$pid" "${args[@]}" </dev/null >/dev/null 2>&1 &
