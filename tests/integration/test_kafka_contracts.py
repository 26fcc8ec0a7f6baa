"""Against the real broker: topics are created idempotently, samples survive the round trip."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer
from kafka import KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from pipeline import schemas_tool
from pipeline.config import KafkaSettings, Settings
from pipeline.model import TOPIC_VALUES, Event
from pipeline.wire import codec
from pipeline.wire.admin import create_topics
from pipeline.wire.group_topics import TABLES, changelog_name, group_name, group_topics
from pipeline.wire.topics import TOPICS, TopicSpec, topic_name
from streams.worker import prepare_topics

pytestmark = pytest.mark.kafka


def _run_cli(kafka: KafkaSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
        "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "FLEETPULSE_KAFKA__PARTITIONS": str(kafka.partitions),
        "FLEETPULSE_METRICS__PORT": "0",  # the default ports may be another run's
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_topics_create_is_idempotent_with_the_right_shape(kafka_settings: KafkaSettings) -> None:
    every = len(TOPICS) + len(group_topics(kafka_settings, group_name(kafka_settings)))
    first = _run_cli(kafka_settings, "topics", "create")
    assert first.returncode == 0, first.stderr
    assert f"{every} created, 0 already present" in first.stdout
    second = _run_cli(kafka_settings, "topics", "create")
    assert second.returncode == 0, second.stderr
    assert f"0 created, {every} already present" in second.stdout

    admin = KafkaAdminClient(bootstrap_servers=kafka_settings.bootstrap)
    try:
        described = {t["name"]: t for t in admin.describe_topics()}
        def partitions(spec: TopicSpec) -> int:
            return len(described[topic_name(kafka_settings, spec.suffix)]["partitions"])

        # co-partitioned topics agree on their partition count; the fleet-wide policy input
        # has one partition so that the policy stage reads it in one order
        assert {partitions(s) for s in TOPICS if not s.single} == {kafka_settings.partitions}
        assert {partitions(s) for s in TOPICS if s.single} == {1}
        state = topic_name(kafka_settings, "node-state")
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, state)])
        assert configs["topic"][state]["cleanup.policy"]["value"] == "compact"
        gpu = topic_name(kafka_settings, "telemetry.gpu")
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, gpu)])
        assert configs["topic"][gpu]["retention.ms"]["value"] == str(kafka_settings.retention_ms)
    finally:
        admin.close()
    # and the default worker group's changelogs, made before any worker starts
    _assert_changelogs(kafka_settings, group_name(kafka_settings))


def _assert_changelogs(kafka: KafkaSettings, group: str) -> None:
    """Every table's changelog of `group` is served, with faust's shape: compacted, one
    partition for the policy table and the configured count for the others."""
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        names = [changelog_name(group, table) for table in TABLES]
        described = {t["name"]: t for t in admin.describe_topics(names)}
        partitions = {name: len(described[name]["partitions"]) for name in names}
        assert partitions == {
            name: 1 if table in ("policy", "capacity") else kafka.partitions  # one order each
            for name, table in zip(names, TABLES, strict=True)
        }
        resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        configs = admin.describe_configs(resources)["topic"]
        assert {configs[name]["cleanup.policy"]["value"] for name in names} == {"compact"}
    finally:
        admin.close()


def test_a_worker_makes_its_groups_changelogs_before_faust_starts(settings: Settings) -> None:
    # FleetPulse's topics are there, group w's are not (those made are the default group's):
    # the worker makes them itself, and they are served before faust's clients ask for them, so
    # the group's first assignment has every changelog (faust alone declared them racily)
    kafka, w = settings.kafka, f"{settings.kafka.topic_prefix}-w"  # a group of this test's
    create_topics(kafka)
    assert not set(_existing(kafka)) & {t.name for t in group_topics(kafka, w)}
    group = msgspec.structs.replace(settings.worker, group_id=w)
    internal = prepare_topics(msgspec.structs.replace(settings, worker=group))
    assert set(internal) < set(_existing(kafka))
    _assert_changelogs(kafka, w)


def _existing(kafka: KafkaSettings) -> list[str]:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        return [t["name"] for t in admin.describe_topics()]
    finally:
        admin.close()


def _samples() -> list[tuple[str, Event]]:
    samples = []
    for name, cls in TOPIC_VALUES.items():
        raw = (schemas_tool.SCHEMA_DIR / "samples" / schemas_tool.file_name(cls)).read_bytes()
        samples.append((name, codec.decode(raw, cls)))
    return samples


def test_every_sample_survives_kafka_python_to_aiokafka(kafka_settings: KafkaSettings) -> None:
    assert _run_cli(kafka_settings, "topics", "create").returncode == 0
    by_topic = {spec.value: topic_name(kafka_settings, spec.suffix) for spec in TOPICS}
    # peer samples and fabric ticks travel only on the worker's own fleet-input topic
    internal = [name for name, event in _samples() if type(event) not in by_topic]
    assert internal == ["peer_sample", "fabric_tick"]
    sent = [(name, event) for name, event in _samples() if type(event) in by_topic]
    producer = KafkaProducer(bootstrap_servers=kafka_settings.bootstrap, acks="all")
    for _, event in sent:
        producer.send(by_topic[type(event)], key=b"k", value=codec.encode(event))
    producer.flush(timeout=30)
    producer.close()

    received = asyncio.run(_consume(kafka_settings, sorted(set(by_topic.values())), len(sent)))
    decoded = {
        type(event): event
        for topic, raw in received
        for event in [codec.decode(raw, next(c for c, t in by_topic.items() if t == topic))]
    }
    assert decoded == {type(event): event for _, event in sent}


async def _consume(
    kafka: KafkaSettings, topics: list[str], expected: int
) -> list[tuple[str, bytes]]:
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=kafka.bootstrap,
        group_id=f"{kafka.topic_prefix}-readers",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    received: list[tuple[str, bytes]] = []
    try:
        async with asyncio.timeout(60):
            while len(received) < expected:
                batch = await consumer.getmany(timeout_ms=1000)
                for partition, records in batch.items():
                    received += [(partition.topic, r.value) for r in records if r.value]
        await consumer.commit()
    finally:
        await consumer.stop()
    return received


def test_json_values_are_plain_utf8_objects(kafka_settings: KafkaSettings) -> None:
    # Consumers in other languages read these bytes with a JSON parser and the schema files.
    for name, event in _samples():
        body = json.loads(codec.encode(event).decode("utf-8"))
        assert body["schema"] == schemas_tool.schema_tag(TOPIC_VALUES[name])


def test_cloudevents_headers_survive_the_broker(kafka_settings: KafkaSettings) -> None:
    # what the worker sends (streams/context.py: the same headers function), read back by
    # another client and parsed by the CloudEvents SDK's Kafka binding
    from cloudevents.core.bindings.kafka import KafkaMessage, from_binary
    from cloudevents.core.formats.json import JSONFormat

    from pipeline.wire import headers as cloudevents_headers

    assert _run_cli(kafka_settings, "topics", "create").returncode == 0
    wanted = {"action": "actions", "alert": "alerts", "node_state": "node-state"}
    events = dict(_samples())
    producer = KafkaProducer(bootstrap_servers=kafka_settings.bootstrap, acks="all")
    for name, suffix in wanted.items():
        value = codec.encode(events[name])
        producer.send(
            topic_name(kafka_settings, suffix),
            key=b"k",
            value=value,
            headers=cloudevents_headers.headers(events[name], value),
        )
    producer.flush(timeout=30)
    producer.close()

    topics = [topic_name(kafka_settings, suffix) for suffix in wanted.values()]
    records = asyncio.run(_consume_records(kafka_settings, topics, len(wanted)))
    for name, suffix in wanted.items():
        record = records[topic_name(kafka_settings, suffix)]
        headers = {key: bytes(value) for key, value in record.headers}
        assert headers["content-type"] == b"application/json"
        ce = from_binary(KafkaMessage(headers, record.key, record.value), JSONFormat())
        assert record.value == codec.encode(events[name])  # unchanged by the headers
        assert ce.get_data() == json.loads(record.value)
        expected = dict(cloudevents_headers.headers(events[name], record.value))
        assert ce.get_id() == expected["ce_id"].decode()
        assert ce.get_type() == expected["ce_type"].decode()
        assert ce.get_dataschema() == schemas_tool.schema_id(TOPIC_VALUES[name])


async def _consume_records(kafka: KafkaSettings, topics: list[str], expected: int) -> dict[str, Any]:
    """The first record of each topic (its key, value and headers)."""
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=kafka.bootstrap,
        group_id=f"{kafka.topic_prefix}-ce-readers-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    received: dict[str, Any] = {}
    try:
        async with asyncio.timeout(60):
            while len(received) < expected:
                batch = await consumer.getmany(timeout_ms=1000)
                for partition, records in batch.items():
                    received.setdefault(partition.topic, records[0])
    finally:
        await consumer.stop()
    return received
