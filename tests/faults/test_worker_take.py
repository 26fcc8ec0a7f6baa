"""`worker.take`: agents that take records from faust in batches decide what the embedded
runtime decides, with the same ids (the one-at-a-time path is proven in
tests/integration/test_streams_pipeline.py)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, load_settings
from pipeline.model import Action, Finding
from pipeline.wire.topics import topic_name
from streams.app import LAG_INTERVAL_S
from streams.testing import (
    TopicReader,
    WorkerProcess,
    create_topics,
    embedded_outputs,
    produce_events,
    producer,
    scenario,
    wait_worked_off,
    worker_env,
)

pytestmark = pytest.mark.kafka


@pytest.mark.slow  # make faults; worker.take is off by default
def test_a_worker_taking_batches_decides_what_the_embedded_runtime_decides(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    kafka = KafkaSettings(
        bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3
    )
    settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    events = list(scenario().events())
    expected = embedded_outputs(settings, events)
    env = worker_env(settings, tmp_path, FLEETPULSE_WORKER__TAKE="500")
    create_topics(env)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    reader = TopicReader(kafka_bootstrap, [topic_name(kafka, s) for s in ("actions", "findings")])
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=120)
        kafka_producer = producer(kafka_bootstrap)
        produce_events(settings, events, kafka_producer)
        kafka_producer.close()

        def outputs() -> int:
            reader.poll()
            return sum(len(records) for records in reader.records.values())

        wait_worked_off(worker.metrics_port(), r"\.telemetry\.|\.events\.|\.inventory\b",
                        len(events), timeout=240, quiet_s=2 * LAG_INTERVAL_S + 1,
                        outputs=outputs, why=worker.tail)
        time.sleep(1)
        reader.poll()
        actions = reader.values(topic_name(kafka, "actions"), Action)
        findings = reader.values(topic_name(kafka, "findings"), Finding)
    finally:
        reader.close()
        code = worker.stop()
    assert code == 0, worker.tail()
    wanted = {a.action_id: a for a in expected["actions"] if isinstance(a, Action)}
    assert wanted, "the scenario acts on its faults"
    assert {a.action_id for a in actions} == wanted.keys()
    assert {(a.kind, a.target.name) for a in actions} == {
        (a.kind, a.target.name) for a in wanted.values()
    }
    assert {f.finding_id for f in findings} == {
        f.finding_id for f in expected["findings"] if isinstance(f, Finding)
    }
