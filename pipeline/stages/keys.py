"""The one key vocabulary: what every stage keys its state by, and so what decides partitions.

- a node or slice (telemetry, health): `cluster/name`;
- a pool (policy): `cluster/pool` (pool names repeat across clusters, GKE's "default-pool";
  budgets must not), and the guard's own key among the policy states, GUARD_KEY;
- a zone (zone stage) and a cluster (fleet stage): their names;
- a utilization row: its node or slice; an alert: its fingerprint.

Nothing else builds a key: the stages and both drivers call these.
"""

from __future__ import annotations

from pipeline.model import (
    Action,
    CapacityEvent,
    Finding,
    NodeEvent,
    NodeState,
    Proposal,
    Target,
    Utilization,
)
from pipeline.wire.topics import record_key, scoped

GUARD_KEY = "*guard"  # the guard's key among the policy states (no pool name has a '*')

__all__ = [
    "GUARD_KEY",
    "announcement_key",
    "health_key",
    "node_key",
    "policy_key",
    "pool_key",
    "pool_name",
    "record_key",
    "row_key",
    "target_name",
]


def node_key(cluster: str, name: str) -> str:
    """A node's or slice's key from its cluster and name: `cluster/name`."""
    return scoped(cluster, name)


def target_name(target: Target) -> str:
    """The key of everything about one node or slice: `cluster/name`."""
    return scoped(target.cluster, target.name)


def pool_name(cluster: str, pool: str) -> str:
    return f"{cluster}/{pool}"


def pool_key(target: Target) -> str:
    """The policy's key: a target's pool, named within its cluster."""
    return pool_name(target.cluster, target.pool)


def policy_key(signal: Proposal | NodeState) -> str:
    return pool_key(signal.target)


def health_key(signal: Finding | NodeEvent | Action) -> str:
    if isinstance(signal, Finding):
        return target_name(signal.entity.target)
    if isinstance(signal, Action):
        return target_name(signal.target)
    return scoped(signal.cluster, signal.target)


def announcement_key(event: NodeEvent | CapacityEvent) -> str | None:
    """The node or slice an event announces (its telemetry key), None for a zone-wide one."""
    if event.target is None or event.cluster is None:
        return None
    return scoped(event.cluster, event.target)


def row_key(row: Utilization) -> str:
    return scoped(row.cluster, row.slice or row.node)
