"""Fail safe, round 2 (issue 35): outages and impossible readings scoped to one zone or pool,
hosts whose clocks run behind or ahead within the door's bounds, and a real fault beside an
outage. Silence and impossible values are no evidence of a node fault: no node is removed for
them, canaries included, while a node with evidence of its own still is.

Each scenario runs the 64-node simulated fleet (40 minutes, no random faults) with its
inventory through the embedded runtime and records its figures for the Reliability table.
"""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pipeline.model import Event, Finding, GpuSample, Inventory, NodeEvent, TpuSample
from tests.faults import reliability
from tests.faults.hostile import (
    MINUTE,
    Outcome,
    fatal_xid,
    first_samples,
    fleet_settings,
    in_nodes,
    in_pool,
    in_zone,
    inventory_of,
    merge,
    outage,
    run,
    simulate,
    skew_host,
    zeroed,
)
from tests.faults.test_fail_safe_property import MINUTES as SMALL_MINUTES
from tests.faults.test_fail_safe_property import _fleet as small_fleet

SIM = fleet_settings()


@pytest.fixture(scope="module")
def fleet() -> tuple[list[Event], list[Inventory]]:
    sim, events = simulate(SIM)
    return events, inventory_of(sim.fleet, SIM.start_ms)


def _t(minutes: float) -> int:
    return SIM.start_ms + int(minutes * MINUTE)


def _scopes(inventory: list[Inventory]) -> tuple[str, str]:
    """The fleet's largest zone and pool."""
    zones = Counter(r.zone for r in inventory if r.kind == "node")
    pools = Counter(r.pool for r in inventory if r.kind == "node")
    return zones.most_common(1)[0][0], pools.most_common(1)[0][0]


def _record(name: str, out: Outcome, **extra: int | str) -> None:
    impossible = out.runtime.counts.get("impossible_values", 0)
    reliability.record("input", name, out.figures(**{"impossible values": impossible, **extra}))


def _scrape_job(events: list[Event]) -> list[tuple[str, str]]:
    """Every eighth node (8 of 64): behind one scrape job, at most 2 in any pool or zone."""
    return sorted(first_samples(events))[3::8]


@pytest.mark.parametrize("scope", ["zone", "pool", "scrape job"])
def test_an_outage_of_one_scope_removes_nothing(
    fleet: tuple[list[Event], list[Inventory]], scope: str
) -> None:
    events, inventory = fleet
    zone, pool = _scopes(inventory)
    job = _scrape_job(events)
    where = {"zone": in_zone(zone), "pool": in_pool(pool)}.get(scope) or in_nodes(job)
    out = run(outage(events, _t(10), _t(25), where), inventory)
    assert out.removals == [], [(a.target.name, a.reason.checks) for a in out.removals]
    assert out.lost == 0
    name = {"zone": zone, "pool": pool}.get(scope) or f"{len(job)} nodes, no pool or zone"
    _record(f"monitoring outage of one {scope} ({name}): its telemetry stops 15 min", out)


def test_one_scrape_job_reading_zero_removes_nothing(
    fleet: tuple[list[Event], list[Inventory]],
) -> None:
    events, inventory = fleet
    job = _scrape_job(events)
    out = run(zeroed(events, _t(10), _t(25), in_nodes(job)), inventory)
    assert out.removals == [], [(a.target.name, a.reason.checks) for a in out.removals]
    assert out.runtime.counts["impossible_values"] > 0
    _record(f"one scrape job ({len(job)} nodes, no pool or zone) reads 0 for 15 min", out)


def test_a_node_dead_alone_beside_a_scrape_job_outage_is_still_removed(
    fleet: tuple[list[Event], list[Inventory]],
) -> None:
    """The node that dies on its own, minutes after a scrape job went dark, fell silent with
    no one: its silence is its own."""
    events, inventory = fleet
    job = _scrape_job(events)
    dead = sorted(first_samples(events))[4]
    assert dead not in job
    dark = outage(events, _t(10), _t(25), in_nodes(job))
    out = run(outage(dark, _t(16), _t(99), in_nodes([dead])), inventory)
    assert [a.target.name for a in out.removals] == [dead[1]]
    _record("one scrape job dark 15 min, a node outside it dead 6 min later", out)


def test_one_zone_reading_zero_removes_nothing_and_is_counted(
    fleet: tuple[list[Event], list[Inventory]],
) -> None:
    events, inventory = fleet
    zone, _ = _scopes(inventory)
    out = run(zeroed(events, _t(10), _t(25), in_zone(zone)), inventory)
    assert out.removals == [], [(a.target.name, a.reason.checks) for a in out.removals]
    assert out.runtime.counts["impossible_values"] > 0
    assert out.lost == 0
    _record(f"one zone ({zone}) reads 0 for 15 min", out)


@pytest.mark.parametrize(("name", "skew_ms"), [
    ("100 s behind", -100_000), ("240 s behind", -240_000), ("200 s ahead", 200_000),
])
def test_a_host_skewed_within_the_door_is_not_silent(
    fleet: tuple[list[Event], list[Inventory]], name: str, skew_ms: int
) -> None:
    events, inventory = fleet
    host = sorted({e.node for e in events if isinstance(e, GpuSample)})[7]
    out = run(skew_host(events, host, _t(10), skew_ms), inventory)
    assert out.removals == [], [(a.target.name, a.reason.checks) for a in out.removals]
    opened = {
        f.check for f in out.of("findings")
        if isinstance(f, Finding) and not f.healthy and f.entity.target.name == host
    }
    assert "clock_skew" in opened and not opened & {"node.stale", "node.down"}, opened
    _record(f"a host whose clock is {name}, reporting on time", out)


@pytest.fixture(scope="module")
def tpu_fleet() -> tuple[list[Event], list[Inventory]]:
    sim_settings = msgspec.structs.replace(fleet_settings(gpu_nodes=8), tpu_slices=6)
    sim, events = simulate(sim_settings)
    return events, inventory_of(sim.fleet, sim_settings.start_ms)


@pytest.mark.parametrize(("name", "skew_ms"), [
    ("100 s behind", -100_000), ("240 s behind", -240_000), ("200 s ahead", 200_000),
])
def test_a_tpu_host_skewed_within_the_door_is_not_silent(
    tpu_fleet: tuple[list[Event], list[Inventory]], name: str, skew_ms: int
) -> None:
    """A slice's hosts share its key but not their clocks: each is judged in its own time
    base, and one ahead does not make its siblings look silent or late."""
    events, inventory = tpu_fleet
    host, slice_name = sorted({(e.node, e.slice) for e in events if isinstance(e, TpuSample)})[1]
    out = run(skew_host(events, host, _t(10), skew_ms), inventory)
    assert out.removals == [], [(a.target.name, a.reason.checks) for a in out.removals]
    assert out.dead_letters == []
    opened = {
        f.check for f in out.of("findings")
        if isinstance(f, Finding) and not f.healthy and f.entity.target.name == slice_name
    }
    assert opened == {"clock_skew"}, opened
    _record(f"a TPU host whose clock is {name}, reporting on time", out)


def test_a_real_fault_beside_a_zone_outage_is_still_removed(
    fleet: tuple[list[Event], list[Inventory]],
) -> None:
    events, inventory = fleet
    zone, _ = _scopes(inventory)
    samples = first_samples(events)
    elsewhere = next(s for s in samples.values() if s.zone != zone)
    dark = outage(events, _t(10), _t(25), in_zone(zone))
    out = run(merge(dark, [fatal_xid(elsewhere, _t(15))]), inventory)
    assert [a.target.name for a in out.removals] == [elsewhere.node]
    _record(f"one zone ({zone}) dark 15 min, a fatal XID on a node elsewhere", out)


def test_a_node_dead_inside_a_zone_outage_is_removed_on_kubernetes_not_ready(
    fleet: tuple[list[Event], list[Inventory]],
) -> None:
    """Kubernetes says one node of the dark zone is not Ready: its own evidence beside the
    zone's silence. Its peers, silent with it but Ready, stay."""
    events, inventory = fleet
    zone, _ = _scopes(inventory)
    dead = next(s for s in first_samples(events).values() if s.zone == zone)
    dark = outage(events, _t(10), _t(25), in_zone(zone))
    gone = outage(dark, _t(12), _t(99), in_nodes([(dead.cluster, dead.node)]))
    not_ready = NodeEvent(
        ts=_t(13), cluster=dead.cluster, target_kind="node", target=dead.node, pool=dead.pool,
        zone=dead.zone, kind="not_ready", actor="kubernetes", reason="Ready condition changed",
    )
    out = run(merge(gone, [not_ready]), inventory)
    assert [a.target.name for a in out.removals] == [dead.node]
    _record(f"one zone ({zone}) dark 15 min, one of its nodes dead and not Ready", out)


_node = st.integers(0, 23)
_minute = st.integers(2, SMALL_MINUTES - 4)
_ops = st.one_of(
    st.tuples(st.just("outage"), st.sampled_from(["zone", "pool", "job", "fleet"]), _node,
              _minute, st.integers(1, 12)),
    st.tuples(st.just("zeroed"), st.sampled_from(["zone", "pool", "job", "fleet"]), _node,
              _minute, st.integers(1, 12)),
    st.tuples(st.just("skew"), _node, _minute, st.sampled_from([-240_000, -100_000, 200_000])),
)
_SEEN: Counter[str] = Counter()


# no shrinking: each example runs a fleet for 20 minutes; the failure names its ops
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(ops=st.lists(_ops, min_size=1, max_size=4))
def test_no_mix_of_outage_scopes_and_skews_removes_a_healthy_node(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    start, clean, inventory = small_fleet()
    events = list(clean)
    samples = first_samples(events)
    nodes = sorted(samples)
    for op in ops:
        if op[0] == "skew":
            events = skew_host(events, nodes[op[1]][1], start + op[2] * MINUTE, op[3])
            continue
        like = samples[nodes[op[2]]]
        # a scrape job: every fifth node from this one, across pools and zones
        job = in_nodes(nodes[op[2] % 5::5])
        scope = {"zone": in_zone(like.zone), "pool": in_pool(like.pool), "job": job}.get(op[1])
        begin, end = start + op[3] * MINUTE, start + (op[3] + op[4]) * MINUTE
        fault = outage if op[0] == "outage" else zeroed
        events = fault(events, begin, end, scope) if scope else fault(events, begin, end)
    out = run(events, list(inventory))
    assert out.removals == [], (ops, [(a.target.name, a.reason.checks) for a in out.removals])
    assert out.lost == 0
    _SEEN["examples"] += 1
    _SEEN["faults mixed"] += len(ops)
    reliability.record(
        "input", "random mixes of scoped outages, zeros and skews on a healthy fleet (hypothesis)",
        {**_SEEN, "removals": 0, "lost": 0},
    )
