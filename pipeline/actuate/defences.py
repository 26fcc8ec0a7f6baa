"""An actuator's own defences that do not depend on what it acts on.

Anyone who can write fleet.actions can ask for a removal, so an actuator does not take the
record's word for it (issue 33): an action must say until when it holds (`expires_at`), be
recent (`ts`) and arrive under its target's key (cluster/name, the topic contract). New removals
(cordon, drain, repair kinds of a target not already out) are capped per window for the
cluster, each pool and each zone, far above what the policy's budgets allow, so only a forged
or runaway stream meets the cap. The runtime's own checks (labels, partitions) live beside
each actuator (pipeline/kube/defences.py, pipeline/slurm/actuator.py).

Pure: time comes in as `now_ms`; the cap keeps its window in memory (a restart starts a new
one, and the policy's budgets still hold). `section` names the settings in messages
("kubernetes", "slurm"), so a refusal says which knob to turn.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from pipeline.config import ActuatorSettings
from pipeline.model import REPAIR_KINDS, Action
from pipeline.wire.topics import scoped

REMOVALS = frozenset({"cordon", "drain"}) | REPAIR_KINDS
_MS = 1000


@dataclass(frozen=True)
class Refusal:
    why: str  # a short label, counted in the actuator's stats (refusals)
    reason: str  # for people: the echo's reason


def credible(action: Action, key: str | None, now_ms: int, limits: ActuatorSettings,
             section: str = "kubernetes") -> Refusal | None:  # fmt: skip
    """The record itself: expires_at present, ts recent and not ahead, the key its target's.
    `key` None: not read from Kafka (a direct call), so there is no key to compare."""
    if action.expires_at is None:
        return Refusal("no_expires_at", "no expires_at: an action must say until when it holds")
    age_s = (now_ms - action.ts) / _MS
    if age_s > limits.max_action_age_s:
        limit = f"{section}.max_action_age_s ({limits.max_action_age_s:g} s)"
        return Refusal("too_old", f"ts {action.ts} is {age_s:.0f} s ({in_words(age_s)}) old, "
                       f"more than {limit}")
    if -age_s > limits.max_action_ahead_s:
        limit = f"{section}.max_action_ahead_s ({limits.max_action_ahead_s:g} s)"
        return Refusal("ahead", f"ts {action.ts} is {-age_s:.0f} s ahead of this clock, "
                       f"more than {limit}")  # fmt: skip
    wanted = scoped(action.target.cluster, action.target.name)
    if key is not None and key != wanted:
        return Refusal("key", f"record key {key[:200]!r} is not its target's ({wanted!r})")
    return None


class RemovalCap:
    """New removals per window: at most `max_removals` targets in the cluster, and
    `max_removals_per_pool` / `max_removals_per_zone` in one pool or zone. A target counts once
    per window, however many of its actions (cordon, drain, repair) follow. Thread-safe: the
    actuator's workers share one."""

    def __init__(self, settings: ActuatorSettings, section: str = "kubernetes") -> None:
        self.settings, self.section = settings, section
        self._lock = threading.Lock()
        self._taken: deque[tuple[int, str, str, str]] = deque()  # (ms, target, pool, zone)

    def take(self, action: Action, now_ms: int) -> Refusal | None:
        target = action.target
        key = f"{target.kind}:{target.name}"
        with self._lock:
            horizon = now_ms - self.settings.removal_window_s * _MS
            while self._taken and self._taken[0][0] < horizon:
                self._taken.popleft()
            if any(t[1] == key for t in self._taken):
                return None  # counted already in this window
            full = self._full(target.pool, target.zone)
            if full is not None:
                return Refusal("cap", f"{full} in {self.settings.removal_window_s:g} s: the "
                               f"actuator's cap ({self.section}.max_removals*)")  # fmt: skip
            self._taken.append((now_ms, key, target.pool, target.zone))
            return None

    def _full(self, pool: str, zone: str) -> str | None:
        s = self.settings
        checks = (
            (len(self._taken), s.max_removals, "cluster"),
            (sum(1 for t in self._taken if t[2] == pool), s.max_removals_per_pool, f"pool {pool}"),
            (sum(1 for t in self._taken if t[3] == zone), s.max_removals_per_zone, f"zone {zone}"),
        )
        for count, cap, scope in checks:
            if count >= cap:
                return f"{count} removals in {scope} already"
        return None


def in_words(seconds: float) -> str:
    """How long, as a person says it: "40 s", "12 min", "5 h", "3 days", "11 months"."""
    for unit, size, up_to in (("s", 1, 120), ("min", 60, 120), ("h", 3600, 48),
                              ("days", 86_400, 60)):
        if seconds < size * up_to:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds / (30 * 86_400):.0f} months"
