"""Closing the loop on Slurm: the actuator (fleet.actions → `scontrol`, echoed on
fleet.events.node) and the node watcher (`sinfo --json` → fleet.events.node and fleet.inventory).

- `nodes`: what `sinfo --json` says about a node, FleetPulse's marks, pool and zone, pure.
- `commands`: `sinfo`, `scontrol`, `squeue` with timeouts and clear errors.
- `actuator`: cordon (DRAIN), drain (until DRAINED), reboot ASAP, resume of its own drains.
- `watcher`: a poll, diffed against the last one; a failed poll changes nothing.
"""
