"""On the real broker: `fleetpulse inventory load` and `fleetpulse policy release` land where
the worker reads them (fleet.inventory, compacted, keyed cluster/name; fleet.events.policy)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

from pipeline.config import KafkaSettings, SimSettings, load_settings
from pipeline.model import Inventory, PolicyRelease
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.engine import Simulation
from pipeline.sim.fleet import Fleet
from pipeline.sim.inventory import from_fleet
from pipeline.sources.inventory_file import write_inventory
from pipeline.wire import codec
from pipeline.wire.topics import TOPICS, topic_name

pytestmark = pytest.mark.kafka


def _cli(kafka: KafkaSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
        "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "FLEETPULSE_KAFKA__PARTITIONS": str(kafka.partitions),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def _read_all(kafka: KafkaSettings, suffix: str, expected: int) -> list[tuple[int, str, bytes]]:
    """(partition, key, value) of every record on the topic, once `expected` have arrived."""
    consumer = KafkaConsumer(
        topic_name(kafka, suffix), bootstrap_servers=kafka.bootstrap,
        auto_offset_reset="earliest", enable_auto_commit=False,
    )
    seen: list[tuple[int, str, bytes]] = []
    deadline = time.monotonic() + 20
    try:
        while len(seen) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen += [(r.partition, r.key.decode(), r.value) for r in records]
        quiet_until = time.monotonic() + 2  # and nothing more after them
        while time.monotonic() < quiet_until:
            for records in consumer.poll(timeout_ms=500).values():
                seen += [(r.partition, r.key.decode(), r.value) for r in records]
    finally:
        consumer.close()
    return seen


def _fleet() -> tuple[Fleet, int]:
    sim = Simulation(SimSettings(seed=4, gpu_nodes=6, tpu_slices=2, clusters=2, duration_s=60), [])
    return sim.fleet, sim.start_ms


def test_inventory_load_lands_on_the_compacted_topic_keyed_cluster_name(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    fleet, start = _fleet()
    records = from_fleet(fleet, start)
    file = tmp_path / "inventory.jsonl"
    write_inventory(file, records)

    missing = _cli(kafka_settings, "inventory", "load", str(file))
    assert missing.returncode == 2 and "fleetpulse topics create" in missing.stderr
    assert _cli(kafka_settings, "topics", "create").returncode == 0

    run = _cli(kafka_settings, "inventory", "load", str(file))
    assert run.returncode == 0, run.stderr
    assert "8 records (6 nodes, 2 slices) in 2 cluster(s)" in run.stdout
    topic = topic_name(kafka_settings, "inventory")
    assert topic in run.stdout

    landed = _read_all(kafka_settings, "inventory", len(records))
    decoded = {key: codec.decode(value, Inventory) for _, key, value in landed}
    assert len(landed) == len(records) == len(decoded)
    assert decoded == {f"{r.cluster}/{r.name}": r for r in records}
    admin = KafkaAdminClient(bootstrap_servers=kafka_settings.bootstrap)
    try:
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        assert configs["topic"][topic]["cleanup.policy"]["value"] == "compact"
    finally:
        admin.close()


def test_inventory_load_refuses_a_topic_that_is_not_compacted(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    topic = topic_name(kafka_settings, "inventory")
    admin = KafkaAdminClient(bootstrap_servers=kafka_settings.bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "delete"})])
    finally:
        admin.close()
    fleet, start = _fleet()
    file = tmp_path / "inventory.jsonl"
    write_inventory(file, from_fleet(fleet, start))
    run = _cli(kafka_settings, "inventory", "load", str(file))
    assert run.returncode == 2 and "cleanup.policy=delete" in run.stderr, run.stderr
    assert _read_all(kafka_settings, "inventory", 0) == []


def test_policy_release_lands_on_the_topic_the_policy_stage_reads(
    kafka_settings: KafkaSettings,
) -> None:
    assert _cli(kafka_settings, "topics", "create").returncode == 0
    run = _cli(kafka_settings, "policy", "release", "--scope", "zone:us-central1-a",
               "--check", "node.down", "--by", "alice", "--reason", "switch replaced")
    assert run.returncode == 0, run.stderr
    (spec,) = [spec for spec in TOPICS if spec.value is PolicyRelease]
    assert spec.suffix == "events.policy" and spec.single  # the policy stage's own input

    ((partition, key, value),) = _read_all(kafka_settings, spec.suffix, 1)
    release = codec.decode(value, PolicyRelease)
    assert (partition, key) == (0, "zone:us-central1-a")
    assert (release.scope, release.name, release.check, release.actor, release.reason) == (
        "zone", "us-central1-a", "node.down", "alice", "switch replaced"
    )
    assert abs(release.ts - time.time() * 1000) < 120_000
    # and the pipeline takes it as a release, not a dead letter
    letters: list[object] = []
    runtime = EmbeddedRuntime(load_settings(environ={}), lambda s, e: letters.append(e))
    runtime.feed_raw(spec.suffix, value, 0, key)
    assert runtime.counts["in.PolicyRelease"] == 1 and letters == []
