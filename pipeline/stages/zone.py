"""The zone stage: capacity events arrive keyed by zone; the policy runs per pool. This is the
fan-out.

Reads `events.capacity` and `zone-input` (node states, from the health stage) keyed by zone;
its table is `zones`; writes capacity events to the policy's pools (`policy-input`) and those
naming a node or slice to the telemetry stage (`announce-input`).

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

from collections.abc import Iterable, Mapping

import msgspec

from pipeline.errors import DecodeError
from pipeline.model import CapacityEvent, Event, NodeState
from pipeline.stages.base import Out, Part, Stage, control_door, expect_key, tag
from pipeline.stages.keys import announcement_key, pool_key, pool_name
from pipeline.wire.internal import (
    ANNOUNCE_INPUT,
    CAPACITY_INPUT,
    CAPACITY_KEY,
    DEAD_LETTERS,
    POLICY_INPUT,
    ZONE_INPUT,
    ZONE_TABLE,
)


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
        return state, capacity_pools(event, {event.zone: state.pools})
    pools = sorted(pool for pool, first in state.pools.items() if first <= event.ts)
    recent = sorted([*state.recent, event], key=lambda e: (e.ts, e.event_id))[-memory:]
    return ZoneState(pools=state.pools, recent=recent), pools


def on_node_state(
    state: ZoneState | None, node_state: NodeState
) -> tuple[ZoneState, list[CapacityEvent]]:
    """Learn the node's pool; return remembered events the pool should have had already."""
    state = state or ZoneState()
    pool, seen = pool_key(node_state.target), node_state.ts
    before = state.pools.get(pool)
    if before is not None and before <= seen:
        return state, []
    # events at or after `seen` and before the earlier first sighting (already delivered)
    until = before if before is not None else event_ts_max()
    owed = [event for event in state.recent if seen <= event.ts < until]
    return ZoneState(pools={**state.pools, pool: seen}, recent=state.recent), owed


def capacity_pools(event: CapacityEvent, pools_by_zone: Mapping[str, Iterable[str]]) -> list[str]:
    """Capacity events are keyed by zone; the policy is per pool. An event naming its pool goes
    to that pool, a zone-wide one (quota, stock-out) to every pool known in the zone."""
    known = sorted(pools_by_zone.get(event.zone, ()))
    if event.pool is not None and event.cluster is not None:
        return [pool_name(event.cluster, event.pool)]
    if event.pool is not None:
        return [key for key in known if key.partition("/")[2] == event.pool]
    return known


# --- the stage ----------------------------------------------------------------------------


def key(event: Event, got: str | None) -> str:
    zone = event.target.zone if isinstance(event, NodeState) else getattr(event, "zone", None)
    if not isinstance(zone, str):
        raise DecodeError(field="$.schema", expected="'node_state/2'", got=tag(event))
    return expect_key(got, zone, "zone")


def on_item(part: Part, event: NodeState | CapacityEvent, key: str) -> list[Out]:
    before = part.get(key, ZoneState)
    if isinstance(event, NodeState):
        state, owed = on_node_state(before, event)
        if state is before:  # nothing learnt: no changelog write
            return []
        part.put(key, state)
        pool = pool_key(event.target)
        return [Out(POLICY_INPUT, pool, capacity) for capacity in owed]
    refused = control_door(part, event, key)
    if refused:
        return refused
    state, pools = on_capacity(before, event, part.settings.worker.capacity_memory)
    part.put(key, state)
    announced = announcement_key(event)
    outs = [] if announced is None else [Out(ANNOUNCE_INPUT, announced, event)]
    outs.append(Out(CAPACITY_INPUT, CAPACITY_KEY, event))  # once, not per pool
    return outs + [Out(POLICY_INPUT, pool, event) for pool in pools]


STAGE = Stage(
    name="zone",
    inputs=("events.capacity", ZONE_INPUT),
    aligned=(),  # the fan-out rule does not depend on arrival order (above)
    table=ZONE_TABLE,
    key=key,
    on_item=on_item,
    outputs=(POLICY_INPUT, ANNOUNCE_INPUT, CAPACITY_INPUT, DEAD_LETTERS),
)
