"""A rolling upgrade loses no record: the previous version of each upgraded schema
(tests/data/previous/, what a process not yet rolled writes and what the topics still hold) put
on the real broker is read by the current `fleetpulse worker` and `fleetpulse sink lake`: none
is dead-lettered, and the lake holds their rows.

`fleetpulse alerts` reads fleet.alerts only, whose schema (alert/1) has had one version: it has
no earlier record to read, so it is not started here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import msgspec
import pytest
from kafka import KafkaProducer

from pipeline.config import Settings
from pipeline.lake.query import Lake
from pipeline.model import TOPIC_VALUES, DeadLetter, Event, NodeState, Proposal
from pipeline.stages import keys
from pipeline.wire import codec
from pipeline.wire.group_topics import group_name
from pipeline.wire.internal import POLICY_INPUT, ZONE_INPUT
from pipeline.wire.topics import record_key, topic_name
from streams.testing import (
    TopicReader,
    WorkerProcess,
    create_topics,
    metric_sum,
    wait_worked_off,
    worker_env,
)

pytestmark = pytest.mark.kafka
PREVIOUS = Path(__file__).resolve().parents[1] / "data" / "previous"
# Where a record of each previous version waits for the new processes, by topic suffix; the
# worker's own internal topics (its stages' inputs) hold what the old worker wrote.
TOPICS = {
    "gpu_sample.v2.json": ["telemetry.gpu"],
    "xid_event.v1.json": ["events.xid"],
    "node_event.v1.json": ["events.node"],
    "finding.v1.json": ["findings"],
    "action.v2.json": ["actions"],
    "node_state.v1.json": ["node-state", ZONE_INPUT],
    "proposal.v2.json": ["proposals", POLICY_INPUT],
}
INTERNAL = (ZONE_INPUT, POLICY_INPUT)
# the lake's tables and the row each previous-version record must become
LAKE_ROWS = {
    "xid": "SELECT count(*) FROM xid WHERE node = 'gke-a3-mega-pool-7c1f-k2x9' AND xid = 79",
    "findings": "SELECT count(*) FROM findings WHERE finding_id = 'fnd-3c9a5f0e2b7d4a18'",
    "actions": "SELECT count(*) FROM actions WHERE action_id = 'act-0e4f7a9c1d2b3e55'",
    "node_state": "SELECT count(*) FROM node_state WHERE episode = 'ep-5b2e9d14c07a3f88'",
}


def _key(event: Event, suffix: str) -> str:
    """The key the previous release's writer gave the record (its topic's key rule)."""
    if suffix == ZONE_INPUT:
        assert isinstance(event, NodeState)
        return event.target.zone
    if isinstance(event, Proposal | NodeState):
        return keys.policy_key(event)
    if suffix in ("findings", "actions"):
        return keys.health_key(event)  # type: ignore[arg-type]
    return record_key(event)


def _as_current(raw: bytes) -> Event:
    """The record read as its current schema, only to know its key (not through the codec,
    whose reading of it is what the test is about)."""
    value = msgspec.json.decode(raw)
    current = TOPIC_VALUES[value["schema"].partition("/")[0]]
    value["schema"] = current.__struct_config__.tag
    return msgspec.convert(value, current)


def _produce(settings: Settings) -> dict[str, int]:
    """Each previous-version sample, as its old writer sent it, on each topic that holds it;
    returns the records sent per topic name."""
    group = group_name(settings.kafka)
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    sent: dict[str, int] = {}
    try:
        for sample, suffixes in TOPICS.items():
            raw = (PREVIOUS / sample).read_bytes()
            event = _as_current(raw)
            for suffix in suffixes:
                topic = f"{group}-{suffix}" if suffix in INTERNAL else topic_name(
                    settings.kafka, suffix)  # fmt: skip
                producer.send(topic, key=_key(event, suffix).encode(), value=raw)
                sent[topic] = sent.get(topic, 0) + 1
        # and the telemetry as msgpack, as a producer of the previous release may write it
        gpu = (PREVIOUS / "gpu_sample.v2.json").read_bytes()
        packed = msgspec.msgpack.encode(msgspec.json.decode(gpu))
        topic = topic_name(settings.kafka, "telemetry.gpu")
        producer.send(topic, key=_key(_as_current(gpu), "telemetry.gpu").encode(),
                      value=packed, headers=codec.record_headers(codec.MSGPACK))  # fmt: skip
        sent[topic] += 1
        producer.flush(timeout=30)
    finally:
        producer.close()
    return sent


def _run_lake_sink(settings: Settings, lake: Path, log: Path) -> None:
    env = {**os.environ, "FLEETPULSE_KAFKA__BOOTSTRAP": settings.kafka.bootstrap,
           "FLEETPULSE_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
           "FLEETPULSE_LAKE__GROUP_ID": f"lake-{uuid.uuid4().hex[:8]}",
           "FLEETPULSE_METRICS__PORT": "0", "FLEETPULSE_LAKE__FLUSH_SECONDS": "1"}  # fmt: skip
    with log.open("ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(lake),
             "--exit-when-idle", "3"],
            env=env, stdout=out, stderr=subprocess.STDOUT, timeout=90, check=False,
        )  # fmt: skip
    assert done.returncode == 0, f"lake sink exited {done.returncode}:\n{log.read_text()[-3000:]}"


def test_previous_versions_are_read_not_dead_lettered(settings: Settings, tmp_path: Path) -> None:
    env = worker_env(settings, tmp_path)
    create_topics(env)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        port = worker.metrics_port()
        worker.wait_for(r"fleetpulse worker: assigned .*telemetry\.gpu=", 60)
        sent = _produce(settings)
        _run_lake_sink(settings, tmp_path / "lake", tmp_path / "sink.log")

        read = [t for t in sent if not t.endswith((".node-state", ".proposals"))]  # not its own
        pattern = "|".join(map(re.escape, read))
        wait_worked_off(port, pattern, sum(sent[t] for t in read), timeout=60, quiet_s=2,
                        why=worker.tail)  # fmt: skip
        for topic in read:
            seen = metric_sum(port, "fleetpulse_worker_records_in_total", re.escape(topic))
            assert seen >= sent[topic], f"worker read {seen} of {sent[topic]} on {topic}"
        dead = metric_sum(port, "fleetpulse_worker_dead_letters_total")
        assert dead == 0, f"worker dead-lettered {dead}:\n{worker.tail()}"
    finally:
        worker.stop(timeout=60)

    reader = TopicReader(settings.kafka.bootstrap, [topic_name(settings.kafka, "dlq")])
    try:
        reader.poll()
        reader.poll()
        letters = [codec.decode(r.value, DeadLetter) for r in reader.records[reader.topics[0]]]
    finally:
        reader.close()
    assert not letters, "dead letters: " + "; ".join(f"{d.topic}: {d.error}" for d in letters)

    with Lake(tmp_path / "lake") as lake:
        rows = {table: lake.sql(query).rows[0][0] for table, query in LAKE_ROWS.items()}
    assert rows == dict.fromkeys(LAKE_ROWS, 1), f"lake rows of the previous versions: {rows}"
