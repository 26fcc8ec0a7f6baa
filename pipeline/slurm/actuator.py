"""The Slurm actuator: one fleet.actions record in, the node changed through `scontrol`, the
outcome echoed on fleet.events.node with the action's id (docs/slurm.md).

What each action does:
- cordon: `State=DRAIN Reason="fleetpulse: <check> <action_id>"`: new jobs stop, running
  jobs finish (Slurm's DRAIN is Kubernetes' cordon);
- drain: the same, then waits until the node is DRAINED (no job left; DRAINING while jobs
  run) up to slurm.drain_timeout_s, else `blocked`, naming the jobs (the node stays drained);
- reboot, reset_gpu, repair: `scontrol reboot ASAP nextstate=RESUME reason=…` (Slurm drains it,
  reboots it once idle and resumes it), echoed `repair_requested`;
- uncordon: `State=RESUME`, only for a drain with FleetPulse's reason prefix and no reboot
  pending (NHC's rule: never resume someone else's drain).

Rules it keeps beside the shared ones (pipeline/actuate/base.py): a node a person drained (any
reason without the prefix), or in an active maintenance reservation, is `held` and untouched;
an action whose pool or zone the node's partition and features deny is refused, as is a slice
(Slurm has none); new removals count against the same cap as the Kubernetes actuator's;
idempotent by `action_id` through the node's comment (pipeline/slurm/nodes.py); a drain
re-reads the node between polls, so a person who resumes or re-drains it wins.
Slurm has no compare-and-set: a person's drain that lands between the read and `scontrol
update` is overwritten by FleetPulse's reason (a window of milliseconds; docs/slurm.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pipeline.actuate.base import ActuatorStats, BaseActuator, Result
from pipeline.actuate.defences import REMOVALS, Refusal
from pipeline.config import SlurmSettings
from pipeline.errors import SinkError
from pipeline.model import Action
from pipeline.slurm import nodes
from pipeline.slurm.commands import Slurm
from pipeline.slurm.nodes import SlurmNode

REBOOTS = frozenset({"reboot", "reset_gpu", "repair"})
SUPPORTED = frozenset({"cordon", "drain", "uncordon"}) | REBOOTS


class SlurmActuator(BaseActuator[SlurmSettings]):
    """Carries out actions on one Slurm cluster's nodes (`slurm`: its commands)."""

    section = "slurm"

    def __init__(
        self,
        slurm: Slurm,
        settings: SlurmSettings,
        cluster: str,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Any] | None = None,
        stats: ActuatorStats | None = None,
    ) -> None:
        super().__init__(settings, cluster, clock=clock, sleep=sleep, stats=stats)
        self.slurm = slurm
        self.prefix = settings.reason_prefix

    def _on_target(self, action: Action) -> Result:
        target = action.target
        if target.kind != "node":
            return self._refuse(Refusal("slice", f"{target.kind} {target.name}: Slurm has no "
                                        f"slices; the Slurm actuator acts on nodes"))  # fmt: skip
        node = self.slurm.node(target.name)
        if node is None:
            return self._refuse(Refusal("not_found", f"Slurm has no node {target.name}"))
        refusal = self._agrees(action, node)
        if refusal is not None:
            return self._refuse(refusal)
        done = nodes.applied(node, self.prefix).get(action.action_id)
        if done is not None:
            self.count("replayed")
            return Result(done, "already carried out; the replay changed nothing")
        if action.kind not in SUPPORTED:
            return Result("skipped", f"{action.kind} is not supported by the Slurm actuator")
        maintenance = nodes.maintenance_reservations(self.slurm.reservations(), node.name)
        held = nodes.held(node, self.prefix, maintenance)
        if action.kind == "uncordon":
            return self._resume(node, action, held)
        if held is not None:
            return Result("held", f"node {node.name} {held}: left to the person")
        if action.kind in REMOVALS and not nodes.ours(node, self.prefix):
            refusal = self.take_removal(action)
            if refusal is not None:
                return self._refuse(refusal)
        if action.kind == "cordon":
            return self._cordon(node, action)
        if action.kind == "drain":
            return self._drain(node, action)
        return self._reboot(node, action)

    def _agrees(self, action: Action, node: SlurmNode) -> Refusal | None:
        """The node's pool and zone (partition, features) as the watcher reads them, so as the
        inventory has them, must be the action's."""
        where = nodes.place(node, self.settings)
        target = action.target
        if (where.pool, where.zone) == (target.pool, target.zone):
            return None
        return Refusal("labels", f"node {node.name} is in pool {where.pool}, zone {where.zone} "
                       f"(partitions {','.join(node.partitions) or 'none'}, features "
                       f"{','.join(node.features) or 'none'}); the action names pool "
                       f"{target.pool}, zone {target.zone}")  # fmt: skip

    def _reason(self, action: Action, kind: str = "") -> str:
        check = action.reason.checks[0] if action.reason.checks else ""
        return nodes.reason_for(self.prefix, check, action.action_id, kind)

    # --- the actions ----------------------------------------------------------------------

    def _cordon(self, node: SlurmNode, action: Action) -> Result:
        if nodes.ours(node, self.prefix):
            self._record(node, action, "cordoned")
            return Result("cordoned", f"already drained by FleetPulse ({node.reason})")
        reason = self._reason(action)
        self.slurm.update(node.name, State="DRAIN", Reason=reason,
                          **self._comment(node, action, "cordoned"))  # fmt: skip
        return Result("cordoned", f"State=DRAIN, reason {reason!r}: no new jobs, running jobs "
                      f"finish")  # fmt: skip

    def _drain(self, node: SlurmNode, action: Action) -> Result:
        if not nodes.ours(node, self.prefix):
            self.slurm.update(node.name, State="DRAIN", Reason=self._reason(action))
        deadline = self.clock() + self.settings.drain_timeout_s
        while True:
            now = self.slurm.node(node.name)
            if now is None:
                return Result("skipped", f"node {node.name} went away during the drain")
            stopped = self._still_ours(now)
            if stopped is not None:
                return stopped
            if not now.busy:
                self._record(now, action, "drained")
                return Result("drained", f"DRAINED: no job left on node {node.name}")
            if self.clock() >= deadline:
                return self._blocked(now, action)
            self.sleep(min(self.settings.drain_poll_s, max(0.0, deadline - self.clock())))
            if self.stopping.is_set():
                raise SinkError(f"stopping during the drain of node {node.name}: carried on later")

    def _still_ours(self, node: SlurmNode) -> Result | None:
        """None while the drain is still FleetPulse's; else why it stops (a person won)."""
        if not node.drain:
            return Result("skipped", f"node {node.name} was resumed by a person during the "
                          f"drain: drain stopped")  # fmt: skip
        if not nodes.ours(node, self.prefix):
            held = nodes.held(node, self.prefix) or "was drained by a person"
            return Result("held", f"node {node.name} {held} during the drain: drain stopped")
        return None

    def _blocked(self, node: SlurmNode, action: Action) -> Result:
        jobs = nodes.jobs_of(self.slurm.jobs_on(node.name))
        self._record(node, action, "blocked")
        shown = ", ".join(jobs[:10]) or "none listed (completing)"
        return Result("blocked", f"jobs still running on node {node.name} after "
                      f"slurm.drain_timeout_s ({self.settings.drain_timeout_s:g} s): {shown}; "
                      f"the node stays drained")  # fmt: skip

    def _reboot(self, node: SlurmNode, action: Action) -> Result:
        reason = self._reason(action, action.kind)
        self.slurm.reboot(node.name, reason)
        self._record(node, action, "repair_requested")
        return Result("repair_requested", f"scontrol reboot ASAP nextstate=RESUME, reason "
                      f"{reason!r}: rebooted once its jobs end, then resumed")  # fmt: skip

    def _resume(self, node: SlurmNode, action: Action, held: str | None) -> Result:
        if node.reboot_pending:
            return Result("skipped", f"node {node.name} has a reboot pending: left to it")
        if not nodes.ours(node, self.prefix):
            if held is not None:
                return Result("held", f"node {node.name} {held}: FleetPulse resumes only its "
                              f"own drains")  # fmt: skip
            return Result("skipped", f"node {node.name} is not drained by FleetPulse")
        if held is not None:  # our drain, but it is in maintenance now: leave it
            return Result("held", f"node {node.name} {held}: left drained for the person")
        self.slurm.update(node.name, State="RESUME", **self._comment(node, action, "uncordoned"))
        return Result("uncordoned", f"State=RESUME: node {node.name} takes jobs again")

    # --- bookkeeping --------------------------------------------------------------------

    def _comment(self, node: SlurmNode, action: Action, outcome: str) -> dict[str, str]:
        comment = nodes.with_applied(node, self.prefix, action.action_id, outcome)
        return {} if comment is None else {"Comment": comment}

    def _record(self, node: SlurmNode, action: Action, outcome: str) -> None:
        """The outcome in the node's comment (a person's comment stays: the reason is then
        the only record, and a replay after a reboot acts again)."""
        fields = self._comment(node, action, outcome)
        if fields:
            self.slurm.update(node.name, **fields)
