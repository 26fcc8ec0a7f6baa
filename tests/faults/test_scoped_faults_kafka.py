"""The scoped outages, zeros and skewed hosts of test_scoped_faults.py on the real broker
(issue 35): `fleetpulse worker` on three partitions, the inventory enforced, a 24-node fleet for
20 minutes with one zone, one pool or one scrape job silent or reading 0 for 10 minutes, or one
host whose clock is off (behind or ahead, within the door's bounds) while its records arrive on
time. Nothing is removed, no record is lost, and the worker takes exactly the embedded
runtime's actions (none).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, load_settings
from pipeline.model import Action, DeadLetter, Event, GpuSample, Inventory
from pipeline.wire.topics import topic_name
from streams.testing import (
    TopicReader,
    WorkerProcess,
    create_topics,
    metric_sum,
    worker_env,
)
from tests.faults import reliability
from tests.faults.hostile import (
    MINUTE,
    Scope,
    first_samples,
    in_nodes,
    in_pool,
    in_zone,
    outage,
    skew_host,
    zeroed,
)
from tests.faults.test_fail_safe_property import _fleet as small_fleet
from tests.faults.test_input_faults_kafka import (
    _embedded,
    _inputs,
    _load_inventory,
    _produce_as_live,
)

pytestmark = pytest.mark.kafka


def scrape_job(samples: dict[tuple[str, str], GpuSample]) -> list[tuple[str, str]]:
    """Nodes behind one scrape job: taken in name order, at most 2 of any pool or zone."""
    chosen: list[tuple[str, str]] = []
    seen: Counter[str] = Counter()
    for node, sample in sorted(samples.items()):
        pool, zone = f"{sample.cluster}/{sample.pool}", sample.zone
        if seen[pool] < 2 and seen[zone] < 2:
            chosen.append(node)
            seen.update([pool, zone])
    return chosen[:4]  # a sixth of the fleet: under its common-cause share (a fifth)


def _scope(kind: str, events: list[Event]) -> tuple[Scope, str]:
    samples = first_samples(events)
    zones = Counter(s.zone for s in samples.values())
    pools = Counter(s.pool for s in samples.values())
    if kind == "zone":
        zone = zones.most_common(1)[0][0]
        return in_zone(zone), zone
    if kind == "pool":
        pool = pools.most_common(1)[0][0]
        return in_pool(pool), pool
    job = scrape_job(samples)
    return in_nodes(job), f"{len(job)} nodes, at most 2 a pool or zone"


FAULTS: dict[str, Callable[[list[Event], int, int, Scope], list[Event]]] = {
    "silent": outage, "reads 0": zeroed,
}


@pytest.mark.slow  # make faults: a worker per scenario; test_scoped_faults.py runs them embedded
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("kind", "fault"), [
    ("zone", "silent"), ("pool", "silent"), ("scrape job", "silent"), ("zone", "reads 0"),
    ("scrape job", "reads 0"),
])
def test_a_scoped_outage_on_the_real_broker_removes_nothing(
    kafka_bootstrap: str, tmp_path: Path, kind: str, fault: str
) -> None:
    start, clean, fleet_inventory = small_fleet()
    where, name = _scope(kind, list(clean))
    events = FAULTS[fault](list(clean), start + 5 * MINUTE, start + 15 * MINUTE, where)
    removals, letters, lost = _run_worker(kafka_bootstrap, tmp_path, start, events,
                                          list(fleet_inventory))  # fmt: skip
    reliability.record(
        "input",
        f"one {kind} ({name}) {fault} for 10 min (real broker)",
        {"removals": len(removals), "dead-lettered": len(letters),
         "actions same as embedded": "yes", "lost": lost},
    )


@pytest.mark.slow  # make faults; test_scoped_faults.py runs them embedded
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("name", "skew_ms"), [("240 s behind", -240_000), ("200 s ahead", 200_000)])
def test_a_host_skewed_within_the_door_on_the_real_broker_is_not_silent(
    kafka_bootstrap: str, tmp_path: Path, name: str, skew_ms: int
) -> None:
    start, clean, fleet_inventory = small_fleet()
    host = sorted({e.node for e in clean if isinstance(e, GpuSample)})[3]
    events = skew_host(list(clean), host, start + 5 * MINUTE, skew_ms)
    arrivals = [getattr(e, "ts", start) for e in clean]  # on time: as the clean run's records
    removals, letters, lost = _run_worker(kafka_bootstrap, tmp_path, start, events,
                                          list(fleet_inventory), arrivals)  # fmt: skip
    # the clock steps back at 5 min: its next records re-stamp what it already reported, into
    # windows closed before; both runtimes refuse the same few as late, and nothing else
    assert lost == 0 and {d.reason for d in letters} <= {"late"}
    assert all(str(d.key).endswith(f"/{host}") for d in letters), {d.key for d in letters}
    reliability.record(
        "input",
        f"a host whose clock is {name}, reporting on time (real broker)",
        {"removals": len(removals), "dead-lettered": len(letters),
         "actions same as embedded": "yes", "lost": lost},
    )


def _run_worker(
    kafka_bootstrap: str, tmp_path: Path, start: int, events: list[Event],
    inventory: list[Inventory], arrivals: list[int] | None = None,
) -> tuple[list[Action], list[DeadLetter], int]:
    """`events` through the embedded runtime and through `fleetpulse worker` on the real broker
    (the inventory enforced, three partitions, produced as live): asserts that neither removes
    anything, both take the same actions and refuse the same records; returns the removals,
    dead letters and records lost."""
    kafka = KafkaSettings(
        bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3
    )
    base = load_settings(environ={})
    settings = msgspec.structs.replace(
        base, kafka=kafka, inventory=msgspec.structs.replace(base.inventory, enforce=True)
    )

    outputs = _embedded(settings, inventory, events)
    want = {a.action_id for a in outputs.get("actions", []) if isinstance(a, Action)}
    refused = Counter((d.reason, d.key) for d in outputs.get("dlq", []) if isinstance(d, DeadLetter))

    env = worker_env(settings, tmp_path, FLEETPULSE_INVENTORY__ENFORCE="true")
    create_topics(env)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    topics = [topic_name(kafka, s) for s in ("actions", "dlq")]
    reader = TopicReader(kafka_bootstrap, topics)
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=120)
        port = worker.metrics_port()
        _load_inventory(settings, inventory, worker, port)
        _produce_as_live(settings, events, port, start + 30 * MINUTE, arrivals)
        consumed = metric_sum(port, "fleetpulse_worker_records_in_total", r"\.telemetry\.|\.events\.")
        reader.poll()
    finally:
        reader.close()
        assert worker.stop() == 0, worker.tail()
    actions = reader.values(topics[0], Action)
    removals = [a for a in actions if a.kind == "cordon"]
    letters = reader.values(topics[1], DeadLetter)
    assert removals == [], [(a.target.name, a.reason.checks) for a in removals]
    assert {a.action_id for a in actions} == want == set()
    assert Counter((d.reason, d.key) for d in letters) == refused
    lost = _inputs(events) - int(consumed)  # each input is consumed once: processed or a letter
    assert lost == 0
    return removals, letters, lost
