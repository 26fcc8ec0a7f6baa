"""Faulty and hostile inputs never make FleetPulse cordon the fleet, stop, or lose data.

Each test is a scenario over a 64-node simulated fleet (40 minutes, no random faults), with its
inventory, run through the embedded runtime (the logic both runtimes share; the Kafka runtime's
version of these is in test_input_faults_kafka.py). Each records its figures for the README's
Reliability table (tests/faults/reliability.py).
"""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from pipeline.config import load_settings
from pipeline.model import Event, Finding, GpuSample, Utilization
from tests.faults import reliability
from tests.faults.hostile import (
    DAY,
    MINUTE,
    Outcome,
    fatal_xid,
    first_samples,
    fleet_settings,
    inventory_of,
    merge,
    outage,
    run,
    simulate,
    skew_host,
    without_inventory,
    zeroed,
)

SIM = fleet_settings()
SETTINGS = load_settings(environ={})
POLICY = SETTINGS.policy


@pytest.fixture(scope="module")
def fleet() -> tuple[list[Event], list]:  # type: ignore[type-arg]
    sim, events = simulate(SIM)
    return events, inventory_of(sim.fleet, SIM.start_ms)


@pytest.fixture(scope="module")
def clean(fleet: tuple[list[Event], list]) -> Outcome:  # type: ignore[type-arg]
    events, inventory = fleet
    return run(events, inventory)


def _t(minutes: float) -> int:
    return SIM.start_ms + int(minutes * MINUTE)


def _nodes(events: list[Event]) -> list[str]:
    return sorted({e.node for e in events if isinstance(e, GpuSample)})


def test_the_clean_fleet_is_left_alone(clean: Outcome) -> None:
    assert clean.removals == [] and clean.dead_letters == [] and clean.lost == 0
    reliability.record("input", "clean 64-node fleet (reference)", clean.figures())


@pytest.mark.parametrize(
    ("name", "skew_ms"),
    [("+1 day", DAY), ("+10 min", 10 * MINUTE), ("-1 day", -DAY)],
)
def test_a_host_clock_off_is_dead_lettered_and_moves_no_other_node(
    fleet: tuple[list[Event], list], name: str, skew_ms: int  # type: ignore[type-arg]
) -> None:
    events, inventory = fleet
    host = _nodes(events)[7]
    skewed = skew_host(events, host, _t(10), skew_ms)
    out = run(skewed, inventory)
    refused = sum(
        1 for e in skewed if getattr(e, "node", None) == host and getattr(e, "ts", 0) != 0
        and abs(e.ts - _t(0)) > SIM.duration_s * 1000 + 5 * MINUTE  # type: ignore[attr-defined]
    ) if abs(skew_ms) >= DAY else None
    assert out.removals == [], [a.target.name for a in out.removals]
    assert out.lost == 0
    letters = out.dead_letters
    assert letters and all(d.key and d.key.endswith("/" + host) for d in letters)
    assert all("$.ts: expected an event time within" in d.error for d in letters), letters[0].error
    if refused is not None:
        assert len(letters) == refused  # every record of the skewed stretch, and only those
    skew = [f for f in out.of("findings") if isinstance(f, Finding) and f.check == "clock_skew"]
    assert skew and skew[0].entity.target.name == host and skew[0].recommended_action == "watch"
    reliability.record("input", f"host clock {name}", out.figures())


def test_a_monitoring_outage_is_one_common_cause_not_thirty_removals(
    fleet: tuple[list[Event], list],  # type: ignore[type-arg]
) -> None:
    events, inventory = fleet
    out = run(outage(events, _t(10), _t(25)), inventory)
    assert out.common_cause_alerts, "no FleetPulseCommonCause alert"
    assert len(out.removals) <= POLICY.common_cause_canaries, [a.target.name for a in out.removals]
    assert out.lost == 0
    # when telemetry comes back the clock follows it: a few records are dead letters until a
    # quorum of nodes has reported the new time, then every node is processed again
    assert 0 < len(out.dead_letters) < len(inventory) // 4, Counter(d.reason for d in out.dead_letters)
    after = {
        u.node for u in out.of("utilization") if isinstance(u, Utilization) and u.window_start >= _t(26)
    }
    assert len(after) == len(inventory)
    reliability.record("input", "monitoring outage: all GPU telemetry stops 15 min", out.figures())


def test_every_metric_reading_zero_removes_nothing_beyond_canaries(
    fleet: tuple[list[Event], list],  # type: ignore[type-arg]
) -> None:
    events, inventory = fleet
    out = run(zeroed(events, _t(10), _t(25)), inventory)
    by_check: dict[str, int] = {}
    for action in out.removals:
        for check in action.reason.checks:
            by_check[check] = by_check.get(check, 0) + 1
    assert all(n <= POLICY.common_cause_canaries for n in by_check.values()), by_check
    assert out.lost == 0
    reliability.record("input", "monitoring outage: all metrics read 0 for 15 min", out.figures())


def _hopping(events: list[Event]) -> list[Event]:
    samples = first_samples(events)
    xids = [
        fatal_xid(sample, _t(12) + i * 1000, pool=f"hop-{i:02d}")
        for i, sample in enumerate(samples.values())
    ]
    return merge(events, xids)  # type: ignore[arg-type]


def test_records_naming_other_pools_are_dead_lettered_and_create_no_pool(
    fleet: tuple[list[Event], list],  # type: ignore[type-arg]
) -> None:
    events, inventory = fleet
    out = run(_hopping(events), inventory)
    assert out.removals == []
    mismatched = [d for d in out.dead_letters if "the inventory's pool" in d.error]
    assert len(mismatched) == 64
    assert not any(key.split("/")[-1].startswith("hop-") for key in out.runtime.policy)
    assert out.lost == 0
    reliability.record("input", "pool hopping: 64 fatal XIDs, each naming a new pool", out.figures())


def test_pool_hopping_without_an_inventory_is_held_by_the_caps_and_the_common_cause(
    fleet: tuple[list[Event], list],  # type: ignore[type-arg]
) -> None:
    events, _ = fleet
    out = run(_hopping(without_inventory(events)))
    # Without an inventory every XID's pool is believed (64 one-node pools, each with budget
    # for its node), so the caps above the pool are what holds: per zone and fleet-wide.
    fleet_cap = max(POLICY.cap_floor, int(POLICY.fleet_max_unavailable_pct * 64 / 100))
    assert len(out.removals) <= fleet_cap, [a.target.name for a in out.removals]
    per_zone = Counter(a.target.zone for a in out.removals)
    zones = Counter(s.zone for s in first_samples(events).values())
    for zone, removed in per_zone.items():
        zone_cap = max(POLICY.cap_floor, int(POLICY.zone_max_unavailable_pct * zones[zone] / 100))
        assert removed <= zone_cap, (zone, removed, zone_cap)
    assert out.withheld["fleet_cap"] + out.withheld["zone_cap"] + out.withheld["common_cause"]
    assert out.common_cause_alerts
    assert out.lost == 0
    reliability.record(
        "input", "pool hopping without an inventory (caps and common cause only)", out.figures()
    )


def test_ghost_nodes_do_not_raise_a_pool_budget(
    fleet: tuple[list[Event], list],  # type: ignore[type-arg]
) -> None:
    events, inventory = fleet
    samples = first_samples(events)
    pools: dict[tuple[str, str], list[GpuSample]] = {}
    for sample in samples.values():
        pools.setdefault((sample.cluster, sample.pool), []).append(sample)
    _, real = max(pools.items(), key=lambda item: len(item[1]))
    template = real[0]
    ghosts: list[Event] = []
    for ts in range(_t(5), _t(30), 10_000):
        ghosts += [
            msgspec.structs.replace(template, ts=ts, node=f"ghost-{i:03d}") for i in range(100)
        ]
    xids = [fatal_xid(sample, _t(20) + i * 1000) for i, sample in enumerate(real)]
    out = run(merge(events, ghosts + xids), inventory)  # type: ignore[arg-type]
    size = len(real)
    budget = max(POLICY.budget_floor, int(POLICY.fatal_max_unavailable_pct * size / 100))
    removed = {a.target.name for a in out.removals}
    assert not any(name.startswith("ghost-") for name in removed)
    assert len(removed) <= min(budget, POLICY.common_cause_min_targets), removed
    assert out.runtime.counts["unknown_target"] > 0  # the ghosts were seen, and not believed
    reliability.record(
        "input",
        f"ghost nodes: 100 unknown nodes reported into a pool of {size}, all {size} real ones fail",
        out.figures(),
    )


def test_one_node_name_in_two_clusters_is_two_targets(
    fleet: tuple[list[Event], list],  # type: ignore[type-arg]
) -> None:
    events, inventory = fleet
    samples = first_samples(events)
    (cluster, node), sample = sorted(samples.items())[0]
    other = next(c for c, _ in samples if c != cluster)
    twin_of = {"cluster": other}
    twins = [
        msgspec.structs.replace(e, **twin_of)
        for e in events
        if isinstance(e, GpuSample) and e.node == node
    ]
    twin_inventory = [
        msgspec.structs.replace(r, cluster=other) for r in inventory if r.name == node
    ]
    xid = fatal_xid(sample, _t(15))
    out = run(merge(events, [*twins, xid]), inventory + twin_inventory)
    assert [(a.target.cluster, a.target.name) for a in out.removals] == [(cluster, node)]
    assert not any("sent to the state of" in d.error for d in out.dead_letters)
    assert out.lost == 0
    reliability.record(
        "input", "one node name in two clusters, a fatal XID on one", out.figures()
    )
