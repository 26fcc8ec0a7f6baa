"""The fleet stage decides the same whatever order its cluster's records arrive in.

On Kafka the fleet stage's input (one topic keyed by cluster) is written by the telemetry
stage of every partition holding one of the cluster's nodes; with one worker or three, and
after each rebalance, the nodes' records arrive interleaved differently (each node's own in
order). The switch/link verdicts and job stragglers must not depend on it: the stream the
embedded runtime gives the fleet stage is replayed with each node's records delayed by its own
lag, or read at its own pace (a backlog drained faster from some partitions than others: lags
far past `node_down_s`, the nodes heard all along), and the finding and action ids must be the
same.
"""

from __future__ import annotations

from collections import deque
from functools import cache

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import load_settings
from pipeline.model import Event, FabricSample, FabricTick, Finding, Inventory, PeerSample
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim import Simulation, parse_forced
from pipeline.stages import base
from pipeline.stages import cluster as fleet
from pipeline.wire import internal

BASE = load_settings(environ={})
NODES = 12
Signal = tuple[str, Event]


class _Recording(EmbeddedRuntime):
    """The embedded runtime, keeping what its telemetry stage sends the fleet stage."""

    fleet_input: list[Signal]

    def _route(self, outs: list[base.Out], queue: deque, source: object = None) -> None:  # type: ignore[type-arg, override]
        self.fleet_input.extend(
            (out.key, out.event) for out in outs  # type: ignore[misc]
            if out.topic == internal.FLEET_INPUT
        )
        super()._route(outs, queue, source)  # type: ignore[arg-type]


@cache
def _fleet_input() -> tuple[Signal, ...]:
    """A 12-node cluster for 40 minutes: a leaf switch fails, a cable flaps, a node runs slow."""
    sim_settings = msgspec.structs.replace(
        BASE.sim, gpu_nodes=NODES, clusters=1, tpu_slices=0, duration_s=40 * 60,
        random_faults=False, diurnal=False, seed=3,
    )  # fmt: skip
    faults = [parse_forced(s) for s in ("F1/tor@300", "F2@400", "S1@300", "F1/cable@900")]
    runtime = _Recording(msgspec.structs.replace(BASE, sim=sim_settings))
    runtime.fleet_input = []
    runtime.feed_all(Simulation(sim_settings, faults).events())
    return tuple(runtime.fleet_input)


def _decisions(signals: list[Signal]) -> tuple[set[str], set[str]]:
    states: dict[str, fleet.FleetState | None] = {}
    findings: set[str] = set()
    actions: set[str] = set()
    for key, event in signals:
        assert isinstance(event, Inventory | Finding | FabricTick | FabricSample | PeerSample)
        states[key], found, acted = fleet.on_fleet(states.get(key), event, BASE)
        findings |= {f.finding_id for f in found}
        actions |= {a.action_id for a in acted}
    return findings, actions


def _node(event: Event) -> str:
    if isinstance(event, Finding):
        return event.entity.target.name
    assert isinstance(event, Inventory | FabricTick | PeerSample)
    return event.name if isinstance(event, Inventory) else event.node


def _staggered(signals: tuple[Signal, ...], lag_s: dict[str, int]) -> list[Signal]:
    """Each node's records delivered `lag_s[node]` later (an inventory record travels with the
    sample after it), each node's own in their order."""
    at: list[int] = [0] * len(signals)
    due = 0
    for i in range(len(signals) - 1, -1, -1):
        event = signals[i][1]
        if not isinstance(event, Inventory):
            due = event.ts + 1000 * lag_s.get(_node(event), 0)  # type: ignore[attr-defined]
        at[i] = due
    order = sorted(range(len(signals)), key=lambda i: (at[i], i))
    return [signals[i] for i in order]


def _paced(signals: tuple[Signal, ...], slowdown: dict[str, float]) -> list[Signal]:
    """Each node's records read `1 + slowdown[node]` times slower than event time passes, from
    the same start: a backlog whose partitions are drained at different speeds, so a slow
    node's records fall further and further behind the others' (minutes, by the end)."""
    start = min(e.ts for _, e in signals if not isinstance(e, Inventory))  # type: ignore[attr-defined]
    at: list[float] = [0.0] * len(signals)
    due = 0.0
    for i in range(len(signals) - 1, -1, -1):
        event = signals[i][1]
        if not isinstance(event, Inventory):
            elapsed = event.ts - start  # type: ignore[attr-defined]
            due = start + elapsed * (1 + slowdown.get(_node(event), 0.0))
        at[i] = due
    order = sorted(range(len(signals)), key=lambda i: (at[i], i))
    return [signals[i] for i in order]


def test_the_recording_has_switch_link_and_straggler_verdicts() -> None:
    states: dict[str, fleet.FleetState | None] = {}
    found: set[tuple[str, str]] = set()
    for key, event in _fleet_input():
        assert isinstance(event, Inventory | Finding | FabricTick | FabricSample | PeerSample)
        states[key], findings, _ = fleet.on_fleet(states.get(key), event, BASE)
        found |= {(f.check, f.entity.target.kind) for f in findings if not f.healthy}
    assert {("fabric.switch.down", "switch"), ("fabric.link.down", "link"),
            ("job.straggler", "node")} <= found, found  # fmt: skip


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(lags=st.lists(st.integers(0, BASE.detect.node_down_s - 10), min_size=NODES,
                     max_size=NODES))  # fmt: skip
def test_fleet_decisions_do_not_depend_on_arrival_order(lags: list[int]) -> None:
    signals = _fleet_input()
    nodes = sorted({_node(e) for _, e in signals})
    expected = _decisions(list(signals))
    assert _decisions(_staggered(signals, dict(zip(nodes, lags, strict=False)))) == expected


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(slowdowns=st.lists(st.floats(0.0, 0.3), min_size=NODES, max_size=NODES))
def test_fleet_decisions_do_not_depend_on_partitions_read_at_different_speeds(
    slowdowns: list[float],
) -> None:
    signals = _fleet_input()
    nodes = sorted({_node(e) for _, e in signals})
    paced = _paced(signals, dict(zip(nodes, slowdowns, strict=False)))
    assert _decisions(paced) == _decisions(list(signals))


def test_a_node_read_minutes_behind_the_others_is_waited_for() -> None:
    """One node's records 0.3x slower (12 minutes behind after 40): before liveness was counted
    in arrivals, its ports behind the failed switch also came out as link verdicts."""
    signals = _fleet_input()
    nodes = sorted({_node(e) for _, e in signals})
    expected = _decisions(list(signals))
    for slow in nodes:
        assert _decisions(_paced(signals, {slow: 0.3})) == expected, slow


def _peer(node: str, ts: int) -> PeerSample:
    return PeerSample(ts=ts, cluster="c1", node=node, pool="p", zone="z", jobs={})


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3_000)), max_size=60))
@settings(max_examples=200)
def test_the_kept_watermark_is_the_oldest_newest_time_of_the_live_nodes(
    arrivals: list[tuple[str, int]]
) -> None:
    """Live: last heard (a new time from it) within `node_down_s` of the newest time of all,
    and not more than `fleet_wait_max_s` behind it."""
    horizon_ms, wait_max_ms = BASE.detect.node_down_s * 1000, BASE.detect.fleet_wait_max_s * 1000
    state: fleet.FleetState | None = None
    newest: dict[str, int] = {}
    heard_at: dict[str, int] = {}
    for node, seconds in arrivals:
        ts = seconds * 1000
        state, _, _ = fleet.on_fleet(state, _peer(node, ts), BASE)
        if ts > newest.get(node, -1):
            newest[node] = ts
            heard_at[node] = max(newest.values())
        top = max(newest.values())
        live = [t for n, t in newest.items()
                if top - heard_at[n] <= horizon_ms and top - t <= wait_max_ms]
        mark = fleet.watermark(state, horizon_ms, wait_max_ms)
        assert mark == (min(live) if live else None)
        assert mark is None or all(h.ts > mark for h in state.held)  # what it passed went out


def test_a_node_unheard_for_minutes_of_the_clusters_time_but_seconds_of_wall_time_is_live() -> None:
    """A backlog read a partition at a time: node b is not heard while a's records run ten
    minutes ahead, but only two seconds of wall time pass. Without a wall clock (or once the
    silence lasts `node_down_s` on it too) b no longer holds the watermark back."""
    horizon_ms, wait_max_ms = BASE.detect.node_down_s * 1000, BASE.detect.fleet_wait_max_s * 1000
    wall = 1_000_000
    state, _, _ = fleet.on_fleet(None, _peer("b", 0), BASE, wall_ms=wall)
    for seconds in range(30, 630, 30):
        state, _, _ = fleet.on_fleet(state, _peer("a", seconds * 1000), BASE, wall_ms=wall + 2000)
    assert fleet.watermark(state, horizon_ms, wait_max_ms, wall + 2000) == 0  # b is waited for
    assert [h.node for h in state.held][:1] == ["c1/a"]  # a's are held, not judged
    later = wall + 2000 + horizon_ms + 1
    assert fleet.watermark(state, horizon_ms, wait_max_ms, later) == 600_000  # silent on both


def test_whole_fabric_samples_from_a_worker_before_fabric_ticks_decide_the_same() -> None:
    """A worker of an earlier release passed each fabric sample on whole; during a rolling
    upgrade the fleet stage still reads those records, and only their time and node count."""
    signals = _fleet_input()
    ticks = [e for _, e in signals if isinstance(e, FabricTick)]
    assert ticks and not any(isinstance(e, FabricSample) for _, e in signals)

    def whole(event: Event) -> Event:
        if not isinstance(event, FabricTick):
            return event
        return FabricSample(ts=event.ts, cluster=event.cluster, node=event.node, pool="p",
                            zone="z", ports=[])  # fmt: skip

    assert _decisions([(key, whole(e)) for key, e in signals]) == _decisions(list(signals))
