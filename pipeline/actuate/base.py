"""One action in, one outcome out: the part of an actuator that does not depend on what it acts
on (Kubernetes nodes, Slurm nodes).

Rules every actuator keeps (docs/actuators.md): it acts only on actions for its own cluster; a
switch or link (fabric localisation's verdict) is the network team's actuator's, not echoed;
a `dry_run` action is logged, never carried out or echoed; a record that is not credible
(pipeline/actuate/defences.py) is refused; one past `expires_at` is skipped, with how stale it
was; every other outcome is the runtime's (`_on_target`). Each outcome is counted and echoed on
fleet.events.node with the action's id, so the health machine hears what was (not) done.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pipeline.actuate import defences
from pipeline.actuate.defences import Refusal
from pipeline.config import ActuatorSettings
from pipeline.model import Action, NodeEvent, host_kind

log = logging.getLogger(__name__)


S = TypeVar("S", bound=ActuatorSettings)


@dataclass
class ActuatorStats:
    actions: int = 0
    dry_run: int = 0
    other_cluster: int = 0
    network_elements: int = 0  # repair_switch / repair_link: the network team's actuator's
    replayed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict, metadata={"label": "outcome"})
    # actions refused by the actuator's own defences, by why (no_expires_at, too_old, ahead,
    # key, not_found, labels, cap, not_drained, …) and the runtime's (api_rejected)
    refusals: dict[str, int] = field(default_factory=dict, metadata={"label": "why"})
    removals: int = 0  # targets newly cordoned, drained or sent to repair (the cap counts them)
    in_flight: int = field(default=0, metadata={"gauge": True})  # actions being carried out
    api_errors: int = 0  # failures of the runtime's API retried (unreachable, 5xx, timeouts)


class RefusedError(Exception):
    """The runtime refused a request for good (a 400/422, a name scontrol cannot take): the
    action can never be carried out as written. The Kafka side tries it `api_rejections`
    times, then dead-letters it; the actions behind it go on."""


@dataclass(frozen=True)
class Result:
    kind: str  # node_event kind
    reason: str


class BaseActuator(abc.ABC, Generic[S]):
    """`handle` an action; subclasses carry it out on their runtime in `_on_target`.
    `section` names the settings section in messages ("kubernetes", "slurm")."""

    section = ""

    def __init__(
        self,
        settings: S,
        cluster: str,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Any] | None = None,
        stats: ActuatorStats | None = None,
    ) -> None:
        self.settings, self.cluster = settings, cluster
        # set when the process stops: a drain waiting (for a PodDisruptionBudget, for jobs)
        # gives up at once (SinkError: not committed, so it is carried on after the restart)
        self.stopping = threading.Event()
        self.clock, self.sleep = clock, sleep or self.stopping.wait
        self.stats = stats or ActuatorStats()
        self.cap = defences.RemovalCap(settings, self.section)
        self._lock = threading.Lock()  # stats, from the Kafka side's workers

    def handle(self, action: Action, key: str | None = None) -> NodeEvent | None:
        """Carry the action out (or not); the echo for fleet.events.node, None for none.
        `key`: the record's Kafka key, checked against the target (None: not from Kafka).

        Raises SinkError when the runtime cannot be reached or fails: nothing may be
        committed then, and the action comes again."""
        if action.target.cluster != self.cluster:
            self.count("other_cluster")
            return None  # another cluster's actuator (its own consumer group) handles it
        if action.target.kind not in ("node", "slice"):
            # fabric localisation's verdicts on a switch or link: no node to act on, and no
            # echo awaited (node_event/2 names nodes and slices only; docs/actuators.md)
            self.count("network_elements")
            log.info("skipped %s %s %s: the network team's actuator's", action.action_id,
                     action.kind, action.target.name)  # fmt: skip
            return None
        self.count("actions")
        now_ms = int(self.clock() * 1000)
        if action.dry_run:
            self.count("dry_run")
            log.info("dry run, not carried out: %s %s (%s)", action.kind,
                     action.target.name, action.reason.summary)  # fmt: skip
            return None
        result = self._decide(action, key, now_ms)
        with self._lock:
            self.stats.outcomes[result.kind] = self.stats.outcomes.get(result.kind, 0) + 1
        log.info("%s %s %s: %s (%s)", action.action_id, action.kind, action.target.name,
                 result.kind, result.reason)  # fmt: skip
        return self._echo(action, result, int(self.clock() * 1000))

    def _decide(self, action: Action, key: str | None, now_ms: int) -> Result:
        refusal = defences.credible(action, key, now_ms, self.settings, self.section)
        if refusal is not None:
            return self._refuse(refusal)
        if action.expires_at is not None and now_ms > action.expires_at:
            late = now_ms - action.expires_at
            return Result("skipped", f"expired {defences.in_words(late / 1000)} ({late} ms) "
                          f"before it could start (expires_at {action.expires_at})")  # fmt: skip
        return self._on_target(action)

    @abc.abstractmethod
    def _on_target(self, action: Action) -> Result:
        """Carry `action` out on the runtime (the defences passed)."""

    def take_removal(self, action: Action) -> Refusal | None:
        """A new removal of the target: counted against the cap, or refused by it."""
        refusal = self.cap.take(action, int(self.clock() * 1000))
        if refusal is None:
            self.count("removals")
        return refusal

    def count(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + by)

    def count_refusal(self, why: str) -> None:
        with self._lock:
            self.stats.refusals[why] = self.stats.refusals.get(why, 0) + 1

    def _refuse(self, refusal: Refusal) -> Result:
        self.count_refusal(refusal.why)
        return Result("refused", refusal.reason)

    def _echo(self, action: Action, result: Result, now_ms: int) -> NodeEvent:
        target = action.target
        return NodeEvent(
            ts=now_ms,
            cluster=target.cluster,
            target_kind=host_kind(target),
            target=target.name,
            pool=target.pool,
            zone=target.zone,
            kind=result.kind,  # type: ignore[arg-type]  # one of NodeEventKind by construction
            actor=self.settings.actor,
            action_id=action.action_id,
            reason=f"{action.kind}: {result.reason}"[:4096],
        )
