"""The control path holds like the telemetry path: maintenance notices, control records dated by
whoever wrote them, fleets without an inventory and drains that did not happen never remove
more than the guard allows (issue 33).

Each scenario runs a 64-node simulated fleet (40 minutes, no random faults) with its inventory
through the embedded runtime (the logic the worker runs too) and records its figures for the
README's Reliability table ("Control faults").
"""

from __future__ import annotations

import math
from collections import Counter

import msgspec
import pytest

from pipeline.config import load_settings
from pipeline.model import (
    Action,
    CapacityEvent,
    Event,
    GpuSample,
    Inventory,
    MaintenanceWindow,
    NodeEvent,
    PolicyRelease,
)
from tests.faults import reliability
from tests.faults.hostile import (
    MINUTE,
    Outcome,
    fatal_xid,
    first_samples,
    fleet_settings,
    inventory_of,
    merge,
    run,
    simulate,
)

SIM = fleet_settings()
SETTINGS = load_settings(environ={})
POLICY = SETTINGS.policy
YEAR_2286 = 9_970_000_000_000  # a time no clock of ours reaches


@pytest.fixture(scope="module")
def fleet() -> tuple[list[Event], list[Inventory]]:
    sim, events = simulate(SIM)
    return events, inventory_of(sim.fleet, SIM.start_ms)


def _t(minutes: float) -> int:
    return SIM.start_ms + int(minutes * MINUTE)


def _notice(record: Inventory, at: int, *, start: int, end: int, name: str | None = None) -> CapacityEvent:
    return CapacityEvent(
        event_id=f"maint-{name or record.name}",
        ts=at,
        provider="gcp",
        source="compute",
        kind="MAINTENANCE_SCHEDULED",
        severity="info",
        region=record.zone.rsplit("-", 1)[0],
        zone=record.zone,
        cluster=record.cluster,
        pool=record.pool,
        target_kind="node",
        target=name or record.name,
        window=MaintenanceWindow(start=start, end=end),
    )


def _maintenance_cordons(out: Outcome) -> list[Action]:
    return [a for a in out.removals if a.reason.checks == ["maintenance"]]


def _peak_out(actions: list[Action]) -> int:
    out: set[str] = set()
    peak = 0
    for action in actions:
        if action.kind == "uncordon":
            out.discard(action.target.name)
        elif action.kind == "cordon":
            out.add(action.target.name)
            peak = max(peak, len(out))
    return peak


def _allowance(size: int) -> int:
    return max(POLICY.maintenance_floor, math.floor(POLICY.maintenance_max_unavailable_pct * size / 100))


def test_maintenance_notices_for_every_node_pass_the_guard(
    fleet: tuple[list[Event], list[Inventory]],
) -> None:
    """64 MAINTENANCE_SCHEDULED notices at once (a forged feed, or a real mass notice): the
    maintenance allowance of each pool, zone and the fleet holds, and the storm is one common
    cause, not 64 cordons and drains."""
    events, inventory = fleet
    nodes = [r for r in inventory if r.kind == "node"]
    notices = [_notice(r, _t(5), start=_t(30), end=_t(90)) for r in nodes]
    out = run(merge(events, notices), inventory)
    cordons = _maintenance_cordons(out)
    actions = [a for a in out.of("actions") if isinstance(a, Action)]
    pools = Counter((r.cluster, r.pool) for r in nodes)
    zones = Counter(r.zone for r in nodes)
    assert cordons, "no maintenance cordon at all: the notices must still be acted on"
    assert _peak_out(actions) <= _allowance(len(nodes))
    for (cluster, pool), n in Counter((a.target.cluster, a.target.pool) for a in cordons).items():
        assert n <= _allowance(pools[(cluster, pool)]), (pool, n)
    for zone, n in Counter(a.target.zone for a in cordons).items():
        assert n <= _allowance(zones[zone]), (zone, n)
    drains = [a for a in actions if a.kind == "drain"]
    assert {a.target.name for a in drains} <= {a.target.name for a in cordons}
    storm = [a for a in out.common_cause_alerts if a.labels.get("check") == "maintenance"]
    assert storm, "a storm of notices raises FleetPulseCommonCause for 'maintenance'"
    assert sum(out.withheld.values()) >= len(nodes) - len(cordons)
    assert out.lost == 0
    reliability.record(
        "control", "maintenance notices for all 64 nodes at once",
        out.figures(**{"maintenance cordons": len(cordons), "drains": len(drains)}),
    )


def test_maintenance_notices_for_nodes_no_inventory_lists_remove_nothing(
    fleet: tuple[list[Event], list[Inventory]],
) -> None:
    events, inventory = fleet
    like = next(r for r in inventory if r.kind == "node")
    ghosts = [_notice(like, _t(5), start=_t(10), end=_t(30), name=f"ghost-{i:02d}") for i in range(20)]
    out = run(merge(events, ghosts), inventory)
    assert _maintenance_cordons(out) == []
    assert out.withheld["not_in_inventory"] == 20, out.withheld
    reliability.record("control", "maintenance notices for 20 nodes no inventory lists", out.figures())


def _wave(events: list[Event], count: int, at: int) -> list[Event]:
    """A fatal XID on `count` nodes within a minute: a driver wave, one common cause."""
    samples = first_samples(events)
    return [fatal_xid(samples[key], at + i * 1000) for i, key in enumerate(sorted(samples)[:count])]


def _forged(inventory: list[Inventory], check: str) -> list[Event]:
    moved = msgspec.structs.replace(inventory[0], ts=YEAR_2286)
    release = PolicyRelease(
        ts=YEAR_2286, check=check, scope="fleet", name="fleet", actor="mallory", reason="forged"
    )
    return [moved, release]


def _insert(events: list[Event], extra: list[Event], at: int) -> list[Event]:
    """`extra` placed in the recording at event time `at`, whatever their own ts says."""
    cut = next(i for i, e in enumerate(events) if getattr(e, "ts", 0) >= at)
    return [*events[:cut], *extra, *events[cut:]]


@pytest.mark.parametrize("when", ["before the wave", "before any telemetry"])
def test_control_records_dated_2286_move_no_clock(
    fleet: tuple[list[Event], list[Inventory]], when: str
) -> None:
    """A policy_release and an inventory record dated 2286 arrive before an XID 79 wave on 40
    nodes: the guard still sees one common cause and removes what it removes without them."""
    events, inventory = fleet
    waved = merge(events, _wave(events, 40, _t(15)))
    baseline = run(waved, inventory)
    assert baseline.common_cause_alerts and baseline.removals
    check = baseline.common_cause_alerts[0].labels["check"]
    forged = _forged(inventory, check)
    at = _t(10) if when == "before the wave" else SIM.start_ms
    out = run(_insert(waved, forged, at), inventory)
    assert [a.action_id for a in out.removals] == [a.action_id for a in baseline.removals]
    assert len(out.common_cause_alerts) == len(baseline.common_cause_alerts)
    guard = out.runtime.guard
    assert guard is not None and guard.clock < _t(60)
    if when == "before the wave":  # the telemetry's clock is known: both are dead letters
        refused = [d for d in out.dead_letters if "of the telemetry's clock" in d.error]
        assert len(refused) == 2, [d.error for d in out.dead_letters]
    assert out.lost == 0
    reliability.record(
        "control", f"a policy_release and an inventory record dated 2286, {when}",
        out.figures(**{"removals without them": len(baseline.removals)}),
    )


def test_the_worker_refuses_a_control_record_ahead_of_its_wall_clock(
    fleet: tuple[list[Event], list[Inventory]],
) -> None:
    events, inventory = fleet
    head = [e for e in events if getattr(e, "ts", 0) < _t(3)]
    capacity = _notice(inventory[0], YEAR_2286, start=YEAR_2286, end=YEAR_2286 + 1)
    person = NodeEvent(
        ts=YEAR_2286, cluster=inventory[0].cluster, target_kind="node", target=inventory[0].name,
        pool=inventory[0].pool, zone=inventory[0].zone, kind="cordoned", actor="mallory",
    )
    forged = [*_forged(inventory, "xid.79"), capacity, person]
    out = run([*forged, *head], inventory, wall_ms=lambda: _t(3))
    refused = [d for d in out.dead_letters if "the receiving process's clock" in d.error]
    assert len(refused) == len(forged), [d.error for d in out.dead_letters]
    assert {d.topic.rsplit(".", 1)[-1] for d in refused} >= {"policy", "inventory"}
    assert out.removals == [] and out.lost == 0


def test_ghost_names_without_an_inventory_do_not_widen_the_caps(
    fleet: tuple[list[Event], list[Inventory]],
) -> None:
    """No inventory anywhere: 300 healthy ghost nodes appear after the warm-up, then 40 real
    nodes fail at once. The caps stay those of the 64 nodes seen before the burst."""
    events, _ = fleet
    bare = [e for e in events if not isinstance(e, Inventory)]
    like = next(e for e in bare if isinstance(e, GpuSample) and e.ts >= _t(20))
    ghosts = [
        msgspec.structs.replace(e, node=f"ghost-{i:03d}")
        for i in range(300)
        for e in bare
        if isinstance(e, GpuSample) and e.node == like.node and e.ts >= _t(20)
    ]
    hostile = merge(bare, [*ghosts, *_wave(bare, 40, _t(25))])
    out = run(hostile, None, SETTINGS)
    seen_before = len({e.node for e in bare if isinstance(e, GpuSample)})
    fleet_cap = min(POLICY.fleet_max_unavailable, max(
        POLICY.cap_floor, math.floor(POLICY.fleet_max_unavailable_pct * seen_before / 100)))
    assert 0 < len(out.removals) <= fleet_cap, [a.target.name for a in out.removals]
    assert not any(a.target.name.startswith("ghost") for a in out.removals)
    no_inventory = [a for a in out.of("alerts") if getattr(a, "labels", {}).get("alertname") == "FleetPulseNoInventory"]
    assert no_inventory, "no FleetPulseNoInventory alert without an inventory"
    reliability.record(
        "control", "no inventory: 300 ghost nodes after the warm-up, then 40 real nodes fail",
        out.figures(**{"fleet cap of the nodes seen before": fleet_cap}),
    )
