"""Capacity end to end: the simulated fleet's stand-ins → `fleetpulse ingest capacity --once`
(a real subprocess, the real client libraries, a real Kafka) → fleet.events.capacity and
fleet.inventory → the embedded runtime's policy.

The scenario causes the signals: a host maintenance of one GPU node is scheduled a minute
before "now" (its window opens at least 15 minutes later), quota readings drift past their
limits. What the policy does with the records read back from Kafka: it cordons and drains the
node ahead of its window (maintenance pre-drain), and holds a non-fatal removal in a zone out
of quota (capacity deferral).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kafka import KafkaConsumer

from pipeline.config import Settings, SimSettings
from pipeline.decide import policy
from pipeline.model import (
    Action,
    CapacityEvent,
    Event,
    GpuSample,
    Inventory,
    Proposal,
    Reason,
)
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.endpoints.fleet import SimEndpoints
from pipeline.sim.engine import Simulation
from pipeline.sim.faults import parse_forced
from pipeline.sim.fleet import build_fleet
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import decode
from pipeline.wire.topics import topic_name

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]
HOUR_S = 3600


def _read(settings: Settings, suffix: str, kind: type[Event]) -> list[tuple[bytes, Any]]:
    """Every record of a topic written so far (waits until none arrive for 3 s, at most 30 s)."""
    consumer = KafkaConsumer(
        topic_name(settings.kafka, suffix),
        bootstrap_servers=settings.kafka.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    found = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=1000)
            if not batch and found:
                break
            for records in batch.values():
                found += [(r.key, decode(r.value, kind)) for r in records]
    finally:
        consumer.close()
    return found


def _scenario(now_ms: int) -> tuple[Simulation, str]:
    config = SimSettings(
        seed=3,
        duration_s=HOUR_S,
        gpu_nodes=2,
        tpu_slices=1,
        clusters=1,
        random_faults=False,
        intensity=4.0,
        gpu_interval_s=60,
        tpu_interval_s=60,
        ici_interval_s=60,
        start_ms=now_ms - HOUR_S * 1000,
    )
    node = build_fleet(config).gpu_nodes[0].name
    # scheduled a minute before now; the window opens 15 to 240 minutes after the notice
    return Simulation(config, [parse_forced(f"n3/cloud@{HOUR_S - 60}:{node}")]), node


def test_capacity_feeds_drive_the_policy(
    settings: Settings, tmp_path: Path
) -> None:
    create_topics(settings.kafka)
    now_ms = int(time.time() * 1000)
    sim, node = _scenario(now_ms)
    served: list[Event] = []
    with SimEndpoints(sim.fleet, tmp_path / "endpoints", project="fleetpulse-sim") as endpoints:
        for tick in sim.ticks():
            for event in tick:
                endpoints.dispatch(event)
                served.append(event)
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "FLEETPULSE_KAFKA__BOOTSTRAP": settings.kafka.bootstrap,
            "FLEETPULSE_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
            "FLEETPULSE_METRICS__PORT": "0",
            "FLEETPULSE_SOURCES__STATE_DIR": str(tmp_path / "state"),
            "FLEETPULSE_CAPACITY__FEEDS": '["quota", "tpu", "compute", "metadata"]',
            "FLEETPULSE_CAPACITY__MONITORING_ENDPOINT": endpoints.cloudmon.address,
            "FLEETPULSE_CAPACITY__TPU_ENDPOINT": endpoints.tpu_api.address,
            "FLEETPULSE_CAPACITY__COMPUTE_ENDPOINT": endpoints.compute.address,
            "FLEETPULSE_CAPACITY__METADATA_URL": endpoints.metadata[node].address,
            "FLEETPULSE_CAPACITY__QUOTA_LAG_S": "0",
            "FLEETPULSE_CAPACITY__QUOTA_LOOKBACK_S": str(2 * HOUR_S),
        }
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "ingest", "capacity", "--once"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    capacity = _read(settings, "events.capacity", CapacityEvent)
    inventory = _read(settings, "inventory", Inventory)
    events = [event for _, event in capacity]

    # keyed as the topics say: capacity by zone, inventory by cluster/name
    assert all(key == event.zone.encode() for key, event in capacity)
    assert sorted(key for key, _ in inventory) == sorted(
        [f"{n.cluster}/{n.name}".encode() for n in sim.fleet.gpu_nodes]
        + [f"{s.cluster}/{s.name}".encode() for s in sim.fleet.slices]
    )

    # the quota readings the scenario made are the ones read back, point for point
    def quota_view(found: list[CapacityEvent], kind: str, field: str) -> set[tuple[Any, ...]]:
        return {
            (e.zone, e.quota.metric, e.ts, getattr(e.quota, field))
            for e in found
            if e.kind == kind and e.quota is not None
        }

    simulated = [e for e in served if isinstance(e, CapacityEvent)]
    usage = quota_view(events, "QUOTA_USAGE", "usage")
    assert usage and usage == quota_view(simulated, "QUOTA_USAGE", "usage")
    # a QUOTA_CHANGED that left the limit where it was (8 x 1.25, rounded to 8) shows no change
    before = {v[:3]: v[3] for v in quota_view(simulated, "QUOTA_USAGE", "limit")}
    raised = {v for v in quota_view(simulated, "QUOTA_CHANGED", "limit") if before[v[:3]] != v[3]}
    assert quota_view(events, "QUOTA_CHANGED", "limit") == raised
    exceeded = {(e.zone, e.quota.metric, e.ts) for e in events if e.kind == "QUOTA_EXCEEDED" and e.quota}
    assert exceeded and exceeded == {
        (e.zone, e.quota.metric, e.ts) for e in simulated if e.kind == "QUOTA_EXCEEDED" and e.quota
    }

    # the scheduled maintenance, with the scenario's window
    [notice] = [e for e in simulated if e.kind == "MAINTENANCE_SCHEDULED"]
    [scheduled] = [e for e in events if e.kind == "MAINTENANCE_SCHEDULED"]
    assert (scheduled.target, scheduled.source) == (node, "gcp.compute.maintenance")
    assert scheduled.window is not None and notice.window is not None
    assert (scheduled.window.start, scheduled.window.end) == (
        notice.window.start, notice.window.end
    )

    # the policy on these records: telemetry teaches it the pools, then the capacity feed
    lead = settings.policy.maintenance_lead_s
    policy_settings = msgspec.structs.replace(settings.policy, maintenance_lead_s=5 * HOUR_S)
    runtime_settings = msgspec.structs.replace(settings, policy=policy_settings)
    out: dict[str, list[Event]] = {}
    runtime = EmbeddedRuntime(runtime_settings, lambda s, e: out.setdefault(s, []).append(e))
    telemetry = [e for e in served if isinstance(e, GpuSample)]
    last = max((e for e in events if e.kind == "QUOTA_EXCEEDED"), key=lambda e: e.ts)
    at_last: dict[str, policy.PolicyState] = {}
    for event in sorted([*telemetry, *events], key=lambda e: e.ts):
        runtime.feed(event)
        if event is last:  # a copy: the runtime changes its states in place
            at_last = {
                key: msgspec.json.decode(msgspec.json.encode(st), type=policy.PolicyState)
                for key, st in runtime.policy.items()
            }
    runtime.finish()
    actions = [a for a in out.get("actions", []) if isinstance(a, Action)]
    moved = [(a.kind, a.target.name) for a in actions if "maintenance" in a.reason.checks]
    assert ("cordon", node) in moved, f"no maintenance cordon (lead {lead} s): {moved}"
    assert ("drain", node) in moved, f"no maintenance drain: {moved}"

    # capacity deferral: an exceeded quota holds a non-fatal cordon in its zone (later
    # readings below the limit clear the hold, so look at the pool right after it)
    pool_key, state = next(
        (key, st) for key, st in sorted(at_last.items())
        if any(v.target.zone == last.zone for v in st.targets.values())
    )
    assert state.quota_until >= last.ts, "the exceeded quota did not reach the pool"
    assert not state.maintenance, "the maintenance notice comes later (polled after the run)"
    victim = next(v.target for v in state.targets.values())
    proposal = Proposal(
        proposal_id="p-e2e-capacity",
        ts=last.ts + 1,
        kind="cordon",
        target=victim,
        reason=Reason(checks=["gpu.thermal"], finding_ids=[], summary="hot"),
        fatal=False,
        episode="ep-e2e",
        state="degraded",
    )
    _, withheld, alerts = policy.decide(state, proposal, policy_settings)
    assert withheld == [], f"{pool_key}: a non-fatal cordon went ahead while out of quota"
    assert any(alert.labels.get("check") == "policy.capacity" for alert in alerts), alerts
