"""A capacity crunch end to end, up to the capacity stage: the simulator ramps one zone's H100
quota to exhaustion (with a stock-out wave) and reserves part of the fleet; the stand-ins serve
it; `fleetpulse ingest capacity --once` (a real subprocess, the real client libraries) puts it on
a real Kafka; the embedded runtime makes the same run's utilization and node states; the
capacity fold (pipeline/capacity, what the capacity stage runs) takes all of it in event
time and raises FleetPulseCapacityCrunch for the zone's region and type before the quota runs
out, naming the other region's zone with healthy spare H100s and its price. Then the real
worker (`fleetpulse worker`, its capacity agent) reads the same capacity events and inventory
and the run's telemetry from Kafka and publishes the crunch alert naming the spare zone on
fleet.alerts, and snapshots on fleet.capacity.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer

from pipeline.capacity import crunch, view
from pipeline.capacity.prices import catalog_book
from pipeline.config import CapacitySettings, Settings, SimSettings
from pipeline.model import (
    Alert,
    CapacityEvent,
    CapacitySnapshot,
    Event,
    Inventory,
    NodeState,
    Utilization,
)
from pipeline.runtime.embedded import collect
from pipeline.sim.endpoints.fleet import SimEndpoints
from pipeline.sim.engine import Simulation
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import decode
from pipeline.wire.topics import topic_name
from streams.testing import TopicReader, WorkerProcess, produce_events, worker_env

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]
HOURS = 3
CRUNCH_ZONE, SPARE_ZONE = "us-central1-a", "us-east5-a"  # the H100 pools of the two clusters
EXHAUST_S = 2 * 3600


def read_all(settings: Settings, suffix: str, kind: type[Event]) -> list[Event]:
    consumer = KafkaConsumer(
        topic_name(settings.kafka, suffix), bootstrap_servers=settings.kafka.bootstrap,
        auto_offset_reset="earliest", consumer_timeout_ms=3000,
    )  # fmt: skip
    found: list[Event] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=1000)
            if not batch and found:
                break
            for records in batch.values():
                found += [decode(r.value, kind) for r in records]
    finally:
        consumer.close()
    return found


def ingest(settings: Settings, endpoints: SimEndpoints, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FLEETPULSE_KAFKA__BOOTSTRAP": settings.kafka.bootstrap,
        "FLEETPULSE_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "FLEETPULSE_METRICS__PORT": "0",
        "FLEETPULSE_SOURCES__STATE_DIR": str(tmp_path / "state"),
        "FLEETPULSE_CAPACITY__FEEDS": '["quota", "tpu", "compute", "reservations"]',
        "FLEETPULSE_CAPACITY__MONITORING_ENDPOINT": endpoints.cloudmon.address,
        "FLEETPULSE_CAPACITY__TPU_ENDPOINT": endpoints.tpu_api.address,
        "FLEETPULSE_CAPACITY__COMPUTE_ENDPOINT": endpoints.compute.address,
        "FLEETPULSE_CAPACITY__QUOTA_LAG_S": "0",
        "FLEETPULSE_CAPACITY__QUOTA_LOOKBACK_S": str((HOURS + 1) * 3600),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "ingest", "capacity", "--once"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_crunch_names_the_spare_zone_before_the_quota_runs_out(
    settings: Settings, tmp_path: Path
) -> None:
    create_topics(settings.kafka)
    now_ms = int(time.time() * 1000)
    sim_settings = SimSettings(
        seed=5, duration_s=HOURS * 3600, gpu_nodes=12, tpu_slices=0, clusters=2,
        random_faults=False, gpu_interval_s=60, tpu_interval_s=60, ici_interval_s=60,
        crunch_zone=CRUNCH_ZONE, crunch_exhaust_s=EXHAUST_S,
        start_ms=now_ms - HOURS * 3600 * 1000,
    )  # fmt: skip
    sim = Simulation(sim_settings)
    events = list(sim.events())
    with SimEndpoints(sim.fleet, tmp_path / "endpoints", project="fleetpulse-sim") as endpoints:
        for event in events:  # the stand-ins of the capacity APIs need only these
            if isinstance(event, CapacityEvent):
                endpoints.dispatch(event)
        ingest(settings, endpoints, tmp_path)
    capacity = [e for e in read_all(settings, "events.capacity", CapacityEvent)
                if isinstance(e, CapacityEvent)]  # fmt: skip
    inventory = read_all(settings, "inventory", Inventory)
    assert {e.kind for e in capacity} >= {"QUOTA_USAGE", "QUOTA_EXCEEDED", "RESERVATION_CHANGED"}

    # the same run through the embedded pipeline: its utilization windows and node states
    outputs = collect(settings, events)
    derived = [*outputs.get("utilization", []), *outputs.get("node-state", [])]
    assert any(isinstance(e, Utilization) for e in derived)

    exceeded = min(e.ts for e in capacity if e.kind == "QUOTA_EXCEEDED" and e.zone == CRUNCH_ZONE)
    rules = CapacitySettings(crunch_free_below=0)  # the quota and stock-outs alone
    prices = catalog_book()
    state = None
    for member in inventory:
        state, _ = view.on_item(state, member)
    started, named = None, None  # the crunch, and the first of its alerts naming the spare zone
    timed = sorted([*capacity, *derived], key=_time)
    next_tick = sim_settings.start_ms
    for value in timed:
        while _time(value) >= next_tick:  # the stage's timer: every 5 minutes of event time
            state, out = view.on_time(state, next_tick, rules, prices)
            ours = [c for c in [*out.crunch_started, *out.crunch_holding]
                    if c.scope == "us-central1/nvidia-h100-80gb"]  # fmt: skip
            started = started or next(iter(out.crunch_started and ours), None)
            named = named or next((c for c in ours if _names(c, SPARE_ZONE)), None)
            next_tick += 300_000
        state, _ = view.on_item(state, value)
    assert started is not None, "no crunch for the ramped zone"
    assert "quota" in started.reasons
    assert started.ts < exceeded, "the crunch comes before the quota is spent"
    assert (exceeded - started.ts) / 3_600_000 > 1, "and with more than an hour to act"
    # the firing alert's description (updated while it holds) names the zone with spare H100s
    assert named is not None and named.ts < exceeded
    spare = next(s for s in named.spare if s.zone == SPARE_ZONE)
    assert spare.accelerator_type == "nvidia-h100-80gb" and spare.healthy_free > 0
    assert spare.usd_per_hour is not None and spare.price_basis == "on-demand"
    description = crunch.alert_annotations(named)["description"]
    assert f"{SPARE_ZONE} nvidia-h100-80gb on-demand: {spare.healthy_free} healthy free" in description
    through_the_worker(settings, events, tmp_path)


def through_the_worker(settings: Settings, events: list[Event], tmp_path: Path) -> None:
    """The worker's capacity agent on the same input: the adapter's capacity events and
    inventory already on Kafka, the simulator's telemetry produced now."""
    env = worker_env(settings, tmp_path / "worker", FLEETPULSE_CAPACITY__CRUNCH_FREE_BELOW="0")
    (tmp_path / "worker").mkdir()
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    alerts, snapshots = topic_name(settings.kafka, "alerts"), topic_name(settings.kafka, "capacity")
    reader = TopicReader(settings.kafka.bootstrap, [alerts, snapshots])
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*capacity", timeout=120)
        telemetry = [e for e in events if not isinstance(e, CapacityEvent | Inventory)]
        produce_events(settings, telemetry)

        def named() -> bool:
            return any(_crunch_naming(a, SPARE_ZONE) for a in reader.values(alerts, Alert))

        reader.until(named, timeout=150, what=f"a crunch alert naming {SPARE_ZONE}")
        assert any(s.zone == CRUNCH_ZONE for s in reader.values(snapshots, CapacitySnapshot))
    finally:
        reader.close()
        code = worker.stop()
    assert code == 0, worker.tail()


def _crunch_naming(alert: Alert, zone: str) -> bool:
    labels = alert.labels
    return (
        labels.get("alertname") == crunch.ALERTNAME
        and labels.get("region") == "us-central1"
        and labels.get("accelerator_type") == "nvidia-h100-80gb"
        and f"{zone} nvidia-h100-80gb" in alert.annotations.get("description", "")
    )


def _names(found: crunch.Crunch, zone: str) -> bool:
    return any(s.zone == zone and s.healthy_free > 0 for s in found.spare)


def _time(value: Event) -> int:
    if isinstance(value, Utilization):
        return value.window_start + value.window_s * 1000
    if isinstance(value, NodeState | CapacityEvent | Inventory):
        return value.ts
    raise TypeError(type(value).__name__)
