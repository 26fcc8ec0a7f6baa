"""docs/examples/actuator.py against the real broker: one action in, one node event echoed that
FleetPulse decodes, and the same action redelivered is not carried out twice."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
import pytest
from kafka import KafkaConsumer, KafkaProducer

from pipeline import schemas_tool
from pipeline.config import KafkaSettings
from pipeline.model import Action, NodeEvent
from pipeline.wire import codec
from pipeline.wire import headers as cloudevents_headers
from pipeline.wire.topics import topic_name

pytestmark = pytest.mark.kafka
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "actuator.py"


def _run_example(kafka: KafkaSettings, state: Path, group: str) -> str:
    done = subprocess.run(
        [
            sys.executable, str(EXAMPLE), "--bootstrap", kafka.bootstrap,
            "--prefix", kafka.topic_prefix, "--group", group, "--state", str(state),
            "--mode", "pretend", "--max-records", "1",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stderr


def _echoes(kafka: KafkaSettings, wait_s: float) -> list[NodeEvent]:
    consumer = KafkaConsumer(
        topic_name(kafka, "events.node"),
        bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=int(wait_s * 1000),
    )
    try:
        return [codec.decode(record.value, NodeEvent) for record in consumer]
    finally:
        consumer.close()


def test_the_example_actuator_carries_out_an_action_once_and_echoes_it(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    create = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "topics", "create"],
        env={"FLEETPULSE_KAFKA__BOOTSTRAP": kafka_settings.bootstrap,
             "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka_settings.topic_prefix,
             "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert create.returncode == 0, create.stderr
    sample = (schemas_tool.SCHEMA_DIR / "samples" / "action.v3.json").read_bytes()
    now = int(time.time() * 1000)
    action = msgspec.structs.replace(
        codec.decode(sample, Action), kind="drain", ts=now, expires_at=now + 600_000
    )
    value = codec.encode(action)
    producer = KafkaProducer(bootstrap_servers=kafka_settings.bootstrap, acks="all")
    key = f"{action.target.cluster}/{action.target.name}".encode()
    for _ in range(2):  # the same action twice: a redelivery
        producer.send(
            topic_name(kafka_settings, "actions"), key=key, value=value,
            headers=cloudevents_headers.headers(action, value),
        ).get(timeout=30)  # fmt: skip
    producer.close()

    state = tmp_path / "done.sqlite"
    group = f"actuator-{uuid.uuid4().hex[:8]}"
    log = _run_example(kafka_settings, state, group)
    assert "io.fleetpulse.action.drain" in log  # routed on the CloudEvents header
    echoes = _echoes(kafka_settings, wait_s=5)
    assert [(e.kind, e.action_id, e.target, e.actor) for e in echoes] == [
        ("drained", action.action_id, action.target.name, "example-actuator")
    ]
    # the second copy: recognised by action_id, not carried out, nothing echoed
    log = _run_example(kafka_settings, state, group)
    assert "already handled" in log
    assert len(_echoes(kafka_settings, wait_s=3)) == 1
