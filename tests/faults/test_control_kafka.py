"""The control-path scenarios on the real broker: `fleetpulse worker` with its wall clock.

One worker (inventory enforced) reads the small fleet's inventory, then its recording with a
maintenance notice for every GPU node mixed in, and four control records dated 2286 (a policy
release, an inventory record, a capacity event and a person's cordon). The forged four are dead
letters at the door (ahead of the worker's clock), and the notices take out no more than the
fleet's maintenance allowance at once (test_control_path.py runs the same rules embedded).
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, load_settings
from pipeline.model import (
    Action,
    CapacityEvent,
    DeadLetter,
    Event,
    Inventory,
    MaintenanceWindow,
    NodeEvent,
    PolicyRelease,
)
from pipeline.wire.topics import topic_name
from streams.testing import TopicReader, WorkerProcess, create_topics, scenario, worker_env
from tests.faults import reliability
from tests.faults.hostile import MINUTE, inventory_of, merge
from tests.faults.test_input_faults_kafka import _load_inventory, _produce_as_live

pytestmark = pytest.mark.kafka
FAR = 9_970_000_000_000  # 2286


def _notices(inventory: list[Inventory], at: int) -> list[Event]:
    return [
        CapacityEvent(
            event_id=f"maint-{r.name}", ts=at, provider="gcp", source="compute",
            kind="MAINTENANCE_SCHEDULED", severity="info", region=r.zone.rsplit("-", 1)[0],
            zone=r.zone, cluster=r.cluster, pool=r.pool, target_kind="node", target=r.name,
            window=MaintenanceWindow(start=at + 20 * MINUTE, end=at + 80 * MINUTE),
        )
        for r in inventory
        if r.kind == "node"
    ]


def _forged(record: Inventory) -> list[Event]:
    return [
        PolicyRelease(ts=FAR, check="xid.79", scope="fleet", name="fleet", actor="mallory"),
        msgspec.structs.replace(record, ts=FAR),
        msgspec.structs.replace(_notices([record], FAR)[0], event_id="forged-capacity-2286"),  # type: ignore[type-var]
        NodeEvent(
            ts=FAR, cluster=record.cluster, target_kind="node", target=record.name,
            pool=record.pool, zone=record.zone, kind="cordoned", actor="mallory",
        ),
    ]


@pytest.mark.slow  # make faults (50 s); test_control_path.py runs the same records embedded
def test_the_worker_refuses_future_control_records_and_caps_maintenance(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    kafka = KafkaSettings(
        bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3
    )
    base = load_settings(environ={})
    settings = msgspec.structs.replace(base, kafka=kafka)
    sim = scenario()
    inventory = inventory_of(sim.fleet, sim.start_ms)
    start = sim.start_ms
    # the forged four ride in the first slice; the notices two minutes in
    events = merge(list(sim.events()), _notices(inventory, start + 2 * MINUTE))
    events = [*_forged(inventory[0]), *events]
    env = worker_env(settings, tmp_path)
    create_topics(env)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    reader = TopicReader(kafka_bootstrap, [topic_name(kafka, s) for s in ("actions", "dlq")])
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=120)
        port = worker.metrics_port()
        _load_inventory(settings, inventory, worker, port)
        _produce_as_live(settings, events, port, start + 20 * MINUTE)
        reader.until(
            lambda: len(reader.values(reader.topics[1], DeadLetter)) >= 4,
            120, "the four forged control records as dead letters",
        )
        reader.poll()
    finally:
        reader.close()
        assert worker.stop() == 0, worker.tail()
    actions = reader.values(reader.topics[0], Action)
    every = reader.values(reader.topics[1], DeadLetter)
    letters = [d for d in every if "receiving process's clock" in d.error]
    assert len(letters) == 4, [(d.topic, d.error) for d in every]
    forged_topics = {topic_name(kafka, s) for s in
                     ("events.policy", "inventory", "events.capacity", "events.node")}
    assert sorted(d.topic for d in letters) == sorted(forged_topics), [d.topic for d in letters]
    maintenance = [a for a in actions if a.kind == "cordon" and a.reason.checks == ["maintenance"]]
    members = len(inventory)
    allowance = max(base.policy.maintenance_floor,
                    math.floor(base.policy.maintenance_max_unavailable_pct * members / 100))
    assert 1 <= len(maintenance) <= allowance, [a.target.name for a in maintenance]
    assert not any(a.target.name == inventory[0].name and a.ts >= FAR for a in actions)
    reliability.record(
        "control",
        "control records dated 2286 and a notice for every node (real broker)",
        {"dead-lettered": len(letters), "maintenance cordons": len(maintenance),
         "maintenance allowance": allowance, "lost": 0},
    )
