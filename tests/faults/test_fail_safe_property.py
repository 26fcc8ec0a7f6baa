"""The fail-safe promise as a property: whatever mix of hostile and valid records arrives, the
targets out of service never exceed min(pool budget, zone cap, fleet cap) at any moment, and no
target the inventory does not know is ever removed.

The limits are computed here from the inventory and the settings' formulas (policy.py's fatal
ceiling, guard.py's caps), not read back from the code under test.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import cache

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import PolicySettings, load_settings
from pipeline.model import Action, Event, GpuSample, Inventory
from tests.faults import reliability
from tests.faults.hostile import (
    DAY,
    MINUTE,
    fatal_xid,
    first_samples,
    fleet_settings,
    inventory_of,
    merge,
    outage,
    run,
    simulate,
    skew_host,
    zeroed,
)

_SEEN: Counter[str] = Counter()  # over the examples run, for the Reliability table
MINUTES = 20
NODES = 24


@cache
def _fleet() -> tuple[int, tuple[Event, ...], tuple[Inventory, ...]]:
    sim, events = simulate(fleet_settings(gpu_nodes=NODES, minutes=MINUTES))
    return sim.start_ms, tuple(events), tuple(inventory_of(sim.fleet, sim.start_ms))


_node = st.integers(0, NODES - 1)
_minute = st.integers(2, MINUTES - 2)
_fatal = st.tuples(st.just("fatal"), _node, _minute)  # a real fault on a real node
_hostile_ops = st.one_of(
    st.tuples(st.just("hop"), _node, _minute, st.integers(0, 5)),
    st.tuples(st.just("ghost"), _node, _minute, st.integers(1, 30)),
    st.tuples(st.just("twin"), _node, _minute),
    st.tuples(st.just("skew"), _node, _minute, st.sampled_from([DAY, 10 * MINUTE, -DAY])),
    st.tuples(st.just("outage"), _minute, st.integers(1, 15)),
    st.tuples(st.just("zeroed"), _minute, st.integers(1, 15)),
)


def _hostile(ops: list[tuple]) -> list[Event]:  # type: ignore[type-arg]
    start, clean, inventory = _fleet()
    events = list(clean)
    samples = first_samples(events)
    nodes = sorted(samples)
    pools = sorted({(r.cluster, r.pool) for r in inventory})
    extra: list[Event] = []
    for op in ops:
        kind = op[0]
        names_a_node = kind not in ("outage", "zeroed")  # (kind, node, minute, ...)
        at = start + (op[2] if names_a_node else op[1]) * MINUTE
        sample = samples[nodes[op[1]]] if names_a_node else None
        if kind == "fatal" and sample:
            extra.append(fatal_xid(sample, at))
        elif kind == "hop" and sample:
            extra.append(fatal_xid(sample, at, pool=pools[op[3]][1], cluster=pools[op[3]][0]))
        elif kind == "ghost" and sample:
            extra += _ghosts(events, sample, op[3], at)
        elif kind == "twin" and sample:
            other = next(c for c, _ in pools if c != sample.cluster)
            extra.append(fatal_xid(sample, at, cluster=other))
        elif kind == "skew" and sample:
            events = skew_host(events, sample.node, at, op[3])
        elif kind == "outage":
            events = outage(events, at, at + op[2] * MINUTE)
        elif kind == "zeroed":
            events = zeroed(events, at, at + op[2] * MINUTE)
    return merge(events, extra)


def _ghosts(events: list[Event], like: GpuSample, count: int, from_ts: int) -> list[Event]:
    """`count` nodes no inventory lists, reporting healthy into `like`'s pool, one of them
    with a fatal XID: they must neither raise the pool's budget nor be removed."""
    copies = [e for e in events if isinstance(e, GpuSample) and e.node == like.node]
    ghosts: list[Event] = [
        msgspec.structs.replace(e, node=f"ghost-{i:02d}")
        for i in range(count)
        for e in copies
        if e.ts >= from_ts
    ]
    return [*ghosts, fatal_xid(msgspec.structs.replace(like, node="ghost-00"), from_ts + MINUTE)]


def _limits(policy: PolicySettings, inventory: tuple[Inventory, ...]) -> tuple[
    dict[tuple[str, str], int], dict[str, int], int
]:
    def cap(size: int, pct: float, absolute: int) -> int:
        return min(absolute, max(policy.cap_floor, math.floor(pct * size / 100)))

    def pool_ceiling(size: int) -> int:
        limit = min(
            policy.max_unavailable,
            max(policy.budget_floor, math.floor(policy.max_unavailable_pct * size / 100)),
        )
        return max(limit, math.floor(policy.fatal_max_unavailable_pct * size / 100))

    pools = Counter((r.cluster, r.pool) for r in inventory)
    zones = Counter(r.zone for r in inventory)
    return (
        {p: pool_ceiling(n) for p, n in pools.items()},
        {z: cap(n, policy.zone_max_unavailable_pct, policy.zone_max_unavailable) for z, n in zones.items()},
        cap(len(inventory), policy.fleet_max_unavailable_pct, policy.fleet_max_unavailable),
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    valid=st.lists(_fatal, max_size=12, unique_by=lambda op: op[1]),
    hostile=st.lists(_hostile_ops, max_size=5),
)
def test_removals_stay_within_every_cap_and_the_inventory(
    valid: list[tuple], hostile: list[tuple]  # type: ignore[type-arg]
) -> None:
    ops = [*valid, *hostile]
    _, _, inventory = _fleet()
    config = load_settings(environ={})
    pool_cap, zone_cap, fleet_cap = _limits(config.policy, inventory)
    known = {(r.cluster, r.name): r for r in inventory}
    outcome = run(_hostile(ops), list(inventory), config)

    out: set[tuple[str, str]] = set()
    peak = 0
    for action in outcome.of("actions"):
        assert isinstance(action, Action)
        key = (action.target.cluster, action.target.name)
        if action.kind == "uncordon":
            out.discard(key)
            continue
        assert key in known, f"{action.kind} of {key}, which the inventory does not list"
        out.add(key)
        peak = max(peak, len(out))
        members = [known[k] for k in out]
        by_pool = Counter((m.cluster, m.pool) for m in members)
        by_zone = Counter(m.zone for m in members)
        assert len(out) <= fleet_cap, f"{len(out)} out of service, fleet cap {fleet_cap}: {ops}"
        for pool, n in by_pool.items():
            assert n <= min(pool_cap[pool], fleet_cap), f"pool {pool}: {n} out: {ops}"
        for zone, n in by_zone.items():
            assert n <= zone_cap[zone], f"zone {zone}: {n} out, cap {zone_cap[zone]}: {ops}"
    assert outcome.lost == 0
    _SEEN["examples"] += 1
    _SEEN["removals"] += len(outcome.removals)
    _SEEN["hostile records"] += len(hostile)
    _SEEN["most out at once"] = max(_SEEN["most out at once"], peak)
    reliability.record(
        "input",
        "random mixes of hostile and valid records (hypothesis)",
        {**_SEEN, "above a cap": 0, "unknown target removed": 0, "lost": 0},
    )
