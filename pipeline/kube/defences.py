"""The actuator's own defences: what it refuses whatever the policy decided.

Anyone who can write fleet.actions can ask for a removal, so the actuator does not take the
record's word for it (issue 33): an action must say until when it holds (`expires_at`), be
recent (`ts`), arrive under its target's key (cluster/name, the topic contract), name the pool
and zone its nodes are labelled with, and a slice must select TPU nodes only (its label may be
a node-pool label, which a GPU pool has too). New removals (cordon, drain, repair kinds of a
target not already out) are capped per window for the cluster, each pool and each zone, far
above what the policy's budgets allow, so only a forged or runaway stream meets the cap.

Pure: time comes in as `now_ms`; the cap keeps its window in memory (a restart starts a new
one, and the policy's budgets still hold).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.config import KubernetesSettings
from pipeline.kube import nodes
from pipeline.model import Action
from pipeline.wire.topics import scoped

REPAIR_KINDS = frozenset({"reset_gpu", "reboot", "repair", "replace", "repair_slice"})
REMOVALS = frozenset({"cordon", "drain"}) | REPAIR_KINDS
GPU_RESOURCE = "nvidia.com/gpu"
_MS = 1000


@dataclass(frozen=True)
class Refusal:
    why: str  # a short label, counted in ActuatorStats.refusals
    reason: str  # for people: the echo's reason


def credible(action: Action, key: str | None, now_ms: int,
             settings: KubernetesSettings) -> Refusal | None:  # fmt: skip
    """The record itself: expires_at present, ts recent and not ahead, the key its target's.
    `key` None: not read from Kafka (a direct call), so there is no key to compare."""
    if action.expires_at is None:
        return Refusal("no_expires_at", "no expires_at: an action must say until when it holds")
    age_s = (now_ms - action.ts) / _MS
    if age_s > settings.max_action_age_s:
        limit = f"kubernetes.max_action_age_s ({settings.max_action_age_s:g} s)"
        return Refusal("too_old", f"ts {action.ts} is {age_s:.0f} s ({in_words(age_s)}) old, "
                       f"more than {limit}")
    if -age_s > settings.max_action_ahead_s:
        limit = f"kubernetes.max_action_ahead_s ({settings.max_action_ahead_s:g} s)"
        return Refusal("ahead", f"ts {action.ts} is {-age_s:.0f} s ahead of this clock, "
                       f"more than {limit}")  # fmt: skip
    wanted = scoped(action.target.cluster, action.target.name)
    if key is not None and key != wanted:
        return Refusal("key", f"record key {key[:200]!r} is not its target's ({wanted!r})")
    return None


def agrees(action: Action, found: Sequence[Any], settings: KubernetesSettings) -> Refusal | None:
    """The target's nodes as the API server has them: each labelled with the action's pool and
    zone (as the watcher reads them, so as the inventory has them); a slice TPU nodes only."""
    target = action.target
    for node in found:
        where = nodes.place(node, settings.pool_label)
        if (where.pool, where.zone) != (target.pool, target.zone):
            return Refusal("labels", f"node {node.metadata.name} is in pool {where.pool}, zone "
                           f"{where.zone}; the action names pool {target.pool}, zone "
                           f"{target.zone}")  # fmt: skip
        if target.kind == "slice":
            refusal = _tpu_only(node, target.name, settings)
            if refusal is not None:
                return refusal
    return None


def _tpu_only(node: Any, slice_name: str, settings: KubernetesSettings) -> Refusal | None:
    name = node.metadata.name
    if is_gpu_node(node):
        return Refusal("gpu_slice", f"slice {slice_name} selects GPU node {name}: a slice "
                       f"selector never matches a GPU node pool")  # fmt: skip
    if not nodes.node_labels(node).get(settings.tpu_label):
        return Refusal("gpu_slice", f"slice {slice_name} selects node {name}, which has no "
                       f"{settings.tpu_label} label: a slice is TPU nodes only")  # fmt: skip
    return None


def is_gpu_node(node: Any) -> bool:
    labels = nodes.node_labels(node)
    if labels.get("nvidia.com/gpu.product") or labels.get("nvidia.com/gpu.present"):
        return True
    if labels.get("cloud.google.com/gke-accelerator", "").startswith("nvidia"):
        return True
    capacity = (node.status.capacity or {}) if node.status is not None else {}
    return str(capacity.get(GPU_RESOURCE, "0")) not in ("", "0")


class RemovalCap:
    """New removals per window: at most `max_removals` targets in the cluster, and
    `max_removals_per_pool` / `max_removals_per_zone` in one pool or zone. A target counts once
    per window, however many of its actions (cordon, drain, repair) follow. Thread-safe: the
    actuator's workers share one."""

    def __init__(self, settings: KubernetesSettings) -> None:
        self.settings = settings
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
                               f"actuator's cap (kubernetes.max_removals*)")  # fmt: skip
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
