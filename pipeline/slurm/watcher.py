"""The Slurm node watcher: `sinfo --json` every slurm.poll_s → fleet.inventory and
fleet.events.node (docs/slurm.md).

Each poll is diffed against the last good one (pipeline/slurm/nodes.py `changes`): people's
drains and resumes (reason, user, time), DOWN / not responding and back, maintenance
reservations, reboots done, nodes added; a node that leaves gets tombstones on fleet.inventory
and fleet.node-state and a `deleted` event. The first poll only takes stock (inventory for all).

A failed poll (the controller away, a timeout, an answer that is not clean JSON) changes
nothing: the last good poll stays the reference, the failure is counted and logged, /readyz
says so, and the next good poll is diffed against the last good one. It is never read as
"no nodes" or "no drains" (the bug other bridges have: every drain looks lifted at once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.actuate.kafka import Out
from pipeline.config import SlurmSettings
from pipeline.errors import SinkError
from pipeline.model import Event, NodeEvent
from pipeline.retry import Backoff
from pipeline.slurm import nodes
from pipeline.slurm.commands import Slurm
from pipeline.slurm.nodes import SlurmNode
from pipeline.wire.codec import encode
from pipeline.wire.topics import scoped

log = logging.getLogger(__name__)
_RETRY_MAX_S = 60.0


@dataclass
class SlurmWatcherStats:
    polls: int = 0
    poll_errors: int = 0  # polls that failed (controller away, timeout, bad answer): retried
    node_events: int = 0
    inventory_records: int = 0
    tombstones: int = 0
    nodes: int = 0


class SlurmWatcher:
    """Polls turned into records; `emit` sends a batch and returns once acknowledged (raising
    SinkError when it was not: the poll is then not taken as the new reference)."""

    def __init__(self, slurm: Slurm, settings: SlurmSettings, cluster: str,
                 emit: Callable[[list[Out]], None], *, clock: Callable[[], float] = time.time,
                 stats: SlurmWatcherStats | None = None) -> None:  # fmt: skip
        self.slurm, self.settings, self.cluster, self.emit = slurm, settings, cluster, emit
        self.clock = clock
        self.stats = stats or SlurmWatcherStats()
        self.known: dict[str, SlurmNode] | None = None  # the last good poll; None before one
        self.last_error = ""

    def poll(self) -> None:
        """One poll, diffed and sent. Raises SinkError (the reference unchanged) on failure."""
        try:
            current = {node.name: node for node in self.slurm.nodes()}
        except SinkError as exc:
            self.stats.poll_errors += 1
            self.last_error = str(exc)
            raise
        outs = self.diff(self.known, current)
        if outs:
            self.emit(outs)
        self.known = current
        self.last_error = ""
        self.stats.polls += 1
        self.stats.nodes = len(current)

    def diff(self, known: dict[str, SlurmNode] | None, current: dict[str, SlurmNode]) -> list[Out]:
        if known is None:  # the first poll takes stock
            return [self._inventory(node) for node in current.values()]
        outs: list[Out] = []
        for name, node in current.items():
            old = known.get(name)
            found = nodes.changes(old, node, self.settings.reason_prefix)
            outs += [self._event(node, *change) for change in found]
            if old is None or self._inventory_of(old) != self._inventory_of(node):
                outs.append(self._inventory(node))
        for name, node in known.items():
            if name not in current:
                outs += self._gone(node)
        return outs

    def run(self, stop: threading.Event) -> None:
        """Poll every slurm.poll_s until `stop`; after a failure wait (doubling up to 60 s),
        say so in one line, and poll again."""
        backoff = Backoff(self.settings.poll_s, max(self.settings.poll_s, _RETRY_MAX_S))
        while not stop.is_set():
            try:
                self.poll()
                backoff.reset()
                delay = self.settings.poll_s
            except SinkError as exc:
                delay = backoff.next_delay()
                log.warning("%s; nothing read as changed, polling again in %.0f s", exc, delay)
            stop.wait(delay)

    def readiness(self) -> tuple[bool, str]:
        if self.known is None:
            return False, self.last_error or "not polled yet"
        if self.last_error:
            return False, f"the last poll failed: {self.last_error}"[:500]
        return True, f"{len(self.known)} nodes polled"

    # --- records --------------------------------------------------------------------------

    def _now(self) -> int:
        return int(self.clock() * 1000)

    def _inventory_of(self, node: SlurmNode) -> object:
        return nodes.inventory(node, self.cluster, 0, self.settings)

    def _inventory(self, node: SlurmNode) -> Out:
        self.stats.inventory_records += 1
        record = nodes.inventory(node, self.cluster, self._now(), self.settings)
        return self._out("inventory", node.name, record)

    def _event(self, node: SlurmNode, kind: str, actor: str, action_id: str | None,
               reason: str) -> Out:  # fmt: skip
        where = nodes.place(node, self.settings)
        event = NodeEvent(ts=self._now(), cluster=self.cluster, target_kind="node",
                          target=node.name, pool=where.pool, zone=where.zone,
                          kind=kind,  # type: ignore[arg-type]  # NodeEventKind by construction
                          actor=actor[:256], action_id=action_id, reason=reason[:4096])  # fmt: skip
        self.stats.node_events += 1
        return self._out("events.node", node.name, event)

    def _out(self, topic: str, name: str, event: Event) -> Out:
        return Out(topic, scoped(self.cluster, name), encode(event))

    def _gone(self, node: SlurmNode) -> list[Out]:
        key = scoped(self.cluster, node.name)
        self.stats.tombstones += 2
        return [self._event(node, "deleted", "slurm", None, "node removed from Slurm"),
                Out("inventory", key, None), Out("node-state", key, None)]  # fmt: skip
