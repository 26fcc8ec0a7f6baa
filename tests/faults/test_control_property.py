"""The control path's promise as a property: whatever control records a principal that is not an
operator can write (maintenance notices from the capacity adapter's account, node events from
the watcher's or an actuator's, inventory records dated as it likes), on a fleet with no real
fault, FleetPulse's removals never exceed the maintenance allowance of a pool, a zone or the
fleet, and never touch a target the inventory does not list.

The limits are computed here from the inventory and the settings' formula, not read back from
the code under test.
"""

from __future__ import annotations

import math
from collections import Counter

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import load_settings
from pipeline.model import Action, CapacityEvent, Event, Inventory, MaintenanceWindow, NodeEvent
from tests.faults import reliability
from tests.faults.hostile import MINUTE, run
from tests.faults.test_fail_safe_property import MINUTES, NODES, _fleet

_SEEN: Counter[str] = Counter()
FAR = 9_970_000_000_000  # 2286

_node = st.integers(0, NODES + 3)  # the last ones are names no inventory lists
_minute = st.integers(1, MINUTES - 2)
_notice = st.tuples(
    st.just("notice"), _node, _minute,
    st.sampled_from(["MAINTENANCE_SCHEDULED", "MAINTENANCE_STARTED", "MAINTENANCE_DONE"]),
    st.integers(-5, 30),  # window start, minutes from the notice
    st.booleans(),  # dated 2286
)
_person = st.tuples(
    st.just("person"), _node, _minute, st.sampled_from(["cordoned", "uncordoned", "deleted"])
)
_inventory = st.tuples(st.just("inventory"), _node, _minute)


def _target(inventory: tuple[Inventory, ...], index: int) -> tuple[Inventory, str]:
    nodes = [r for r in inventory if r.kind == "node"]
    if index < len(nodes):
        return nodes[index], nodes[index].name
    return nodes[0], f"not-listed-{index}"


def _records(ops: list[tuple]) -> list[tuple[int, Event]]:  # type: ignore[type-arg]
    start, _, inventory = _fleet()
    out: list[tuple[int, Event]] = []
    for number, op in enumerate(ops):
        like, name = _target(inventory, op[1])
        at = start + op[2] * MINUTE
        if op[0] == "notice":
            begin = at + op[4] * MINUTE
            out.append((at, CapacityEvent(
                event_id=f"forged-{number}", ts=FAR if op[5] else at, provider="gcp",
                source="compute", kind=op[3], severity="info", region="r", zone=like.zone,
                cluster=like.cluster, pool=like.pool, target_kind="node", target=name,
                window=MaintenanceWindow(start=begin, end=begin + 20 * MINUTE),
            )))
        elif op[0] == "person":
            out.append((at, NodeEvent(
                ts=at, cluster=like.cluster, target_kind="node", target=name, pool=like.pool,
                zone=like.zone, kind=op[3], actor="someone",
            )))
        else:
            out.append((at, msgspec.structs.replace(like, ts=FAR)))
    return out


def _mixed(ops: list[tuple]) -> list[Event]:  # type: ignore[type-arg]
    _, clean, _ = _fleet()
    forged = sorted(_records(ops), key=lambda pair: pair[0])
    events: list[Event] = []
    i = 0
    for event in clean:
        while i < len(forged) and forged[i][0] <= getattr(event, "ts", 0):
            events.append(forged[i][1])
            i += 1
        events.append(event)
    return events + [event for _, event in forged[i:]]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.one_of(_notice, _person, _inventory), min_size=1, max_size=40))
def test_no_control_records_of_a_non_operator_remove_beyond_the_allowance(
    ops: list[tuple],  # type: ignore[type-arg]
) -> None:
    _, _, inventory = _fleet()
    config = load_settings(environ={})
    policy = config.policy

    def allowance(size: int) -> int:
        return max(policy.maintenance_floor,
                   math.floor(policy.maintenance_max_unavailable_pct * size / 100))

    known = {(r.cluster, r.name): r for r in inventory}
    pools = Counter((r.cluster, r.pool) for r in inventory)
    zones = Counter(r.zone for r in inventory)
    outcome = run(_mixed(ops), list(inventory), config)
    out: set[tuple[str, str]] = set()
    peak = 0
    for action in outcome.of("actions"):
        assert isinstance(action, Action)
        key = (action.target.cluster, action.target.name)
        if action.kind == "uncordon":
            out.discard(key)
            continue
        assert key in known, f"{action.kind} of {key}, which the inventory does not list: {ops}"
        if action.kind != "cordon":
            continue
        assert action.reason.checks == ["maintenance"], f"a fault removal on a healthy fleet: {action}"
        out.add(key)
        peak = max(peak, len(out))
        members = [known[k] for k in out]
        assert len(out) <= allowance(len(inventory)), f"{len(out)} out for maintenance: {ops}"
        for pool, n in Counter((m.cluster, m.pool) for m in members).items():
            assert n <= allowance(pools[pool]), f"pool {pool}: {n} out: {ops}"
        for zone, n in Counter(m.zone for m in members).items():
            assert n <= allowance(zones[zone]), f"zone {zone}: {n} out: {ops}"
    assert outcome.lost == 0
    _SEEN["examples"] += 1
    _SEEN["control records"] += len(ops)
    _SEEN["removals"] += len(outcome.removals)
    _SEEN["most out at once"] = max(_SEEN["most out at once"], peak)
    reliability.record(
        "control",
        "random control records of non-operator principals on a healthy fleet (hypothesis)",
        {**_SEEN, "above an allowance": 0, "unknown target removed": 0, "lost": 0},
    )
