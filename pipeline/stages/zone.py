"""Capacity events arrive keyed by zone; the policy runs per pool. This is the fan-out.

The zone stage keeps, per zone, the pools seen there (learnt from node states, which the health
stage also sends keyed by zone) with the event time each was first seen, and the latest
capacity events. The rule is the embedded runtime's, stated in event time so that it does not
depend on which of two topics Kafka delivers first:

    a zone-wide capacity event C reaches pool P  iff  P was first seen at or before C.ts

(an event naming its pool goes to that pool only). When a pool is learnt after capacity events
that it should have received (its node state was still in flight), the remembered events are
sent to it then; the policy dedupes by event id, so a repeat after a crash is harmless.
"""

from __future__ import annotations

import msgspec

from pipeline.model import CapacityEvent, NodeState
from pipeline.stages import route


class ZoneState(msgspec.Struct, kw_only=True):
    pools: dict[str, int] = {}  # pool key (cluster/pool) -> event time first seen in the zone
    recent: list[CapacityEvent] = []  # zone-wide events, oldest first, at most `memory`


def event_ts_max() -> int:
    return 10**13  # beyond any TimestampMs


def on_capacity(
    state: ZoneState | None, event: CapacityEvent, memory: int
) -> tuple[ZoneState, list[str]]:
    """Remember a zone-wide event; return the pools it goes to now."""
    state = state or ZoneState()
    if event.pool is not None:
        return state, route.capacity_pools(event, {event.zone: state.pools})
    pools = sorted(pool for pool, first in state.pools.items() if first <= event.ts)
    recent = sorted([*state.recent, event], key=lambda e: (e.ts, e.event_id))[-memory:]
    return ZoneState(pools=state.pools, recent=recent), pools


def on_node_state(
    state: ZoneState | None, node_state: NodeState
) -> tuple[ZoneState, list[CapacityEvent]]:
    """Learn the node's pool; return remembered events the pool should have had already."""
    state = state or ZoneState()
    pool, seen = route.pool_key(node_state.target), node_state.ts
    before = state.pools.get(pool)
    if before is not None and before <= seen:
        return state, []
    # events at or after `seen` and before the earlier first sighting (already delivered)
    until = before if before is not None else event_ts_max()
    owed = [event for event in state.recent if seen <= event.ts < until]
    return ZoneState(pools={**state.pools, pool: seen}, recent=state.recent), owed
