"""Replays: the lake holds each record once.

1. The lake sink's consumer group is reset to the earliest offsets (AdminClient
   reset_group_offsets, as `kafka-consumer-groups --reset-offsets --to-earliest` does) with a
   lake that already holds those records; more records follow. The sink skips the offsets the
   lake holds (lake/_offsets): every stored row once, by id.
2. The xid ingest adapter is restarted without its checkpoint: it sends every kernel-log Xid
   again, at new offsets. The lake stores both copies; its views count each Xid once.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, OffsetSpec

from pipeline.config import KafkaSettings
from pipeline.lake.query import Lake
from pipeline.model import Finding
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import encode
from pipeline.wire.topics import topic_name
from tests.faults import reliability
from tests.faults.infra import Proc, base_env, lake_rows, lake_values, wait_until, write_xids
from tests.lake_fixture import FINDINGS

pytestmark = pytest.mark.kafka
ROUND = 300  # findings per round


def _findings(first: int, count: int) -> list[Finding]:
    model = FINDINGS[0]
    return [msgspec.structs.replace(model, finding_id=f"replay-{n:05d}", ts=model.ts + n)
            for n in range(first, first + count)]


def _produce(kafka: KafkaSettings, findings: list[Finding]) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=5)
    topic = topic_name(kafka, "findings")
    for finding in findings:
        producer.send(topic, key=finding.finding_id.encode(), value=encode(finding))
    producer.flush(timeout=60)
    producer.close()


def _reset_to_earliest(kafka: KafkaSettings, group: str) -> dict[TopicPartition, int]:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        topic = topic_name(kafka, "findings")
        specs = {TopicPartition(topic, p): OffsetSpec.EARLIEST for p in range(kafka.partitions)}
        done = admin.reset_group_offsets(group, specs)
        assert all(r["error"].errno == 0 for r in done.values()), done
        return {tp: int(r["offset"]) for tp, r in done.items()}
    finally:
        admin.close()


def _sink(env: dict[str, str], lake: Path, log: Path) -> Proc:
    return Proc("sink", ["sink", "lake", "--lake", str(lake)], env, log).start()


def test_a_group_reset_to_earliest_into_an_existing_lake_stores_nothing_twice(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path)
    group, lake = env["FLEETPULSE_LAKE__GROUP_ID"], tmp_path / "lake"
    first, second = _findings(0, ROUND), _findings(ROUND, ROUND)
    sink = _sink(env, lake, tmp_path / "sink1.log")
    try:
        # in two flushes: files from offset 0 and from the middle, so that a replay from 0
        # (one batch over both) cannot simply overwrite what it wrote before
        for half in (first[: ROUND // 2], first[ROUND // 2 :]):
            _produce(kafka, half)
            wait_until(lambda h=half: lake_rows(lake, "findings") >= first.index(h[-1]) + 1, 90,
                       "the first round", sink)
            time.sleep(3)  # its commit and lake/_offsets mark follow the files
    finally:
        assert sink.stop() == 0, sink.tail()
    reset = _reset_to_earliest(kafka, group)
    assert set(reset.values()) == {0}
    _produce(kafka, second)
    restarted = time.monotonic()
    sink = _sink(env, lake, tmp_path / "sink2.log")
    try:
        wait_until(lambda: lake_rows(lake, "findings") >= 2 * ROUND, 90, "the second round",
                   sink)
        time.sleep(3)  # anything beyond would be a duplicate
    finally:
        assert sink.stop() == 0, sink.tail()
    recovered = time.monotonic() - restarted
    ids = Counter(k[0] for k in lake_values(lake, "findings", ["finding_id"]).elements())
    want = {f.finding_id for f in first + second}
    duplicates = sum(n - 1 for n in ids.values())
    lost = len(want - set(ids))
    reliability.record("infrastructure", "lake sink group reset to earliest", {
        "in": 2 * ROUND, "consumed": 3 * ROUND, "out": lake_rows(lake, "findings"),
        "duplicates": duplicates, "lost": lost, "recovery_s": round(recovered, 2),
        "dedupe": "at write: offsets below lake/_offsets skipped",
    })
    assert lost == 0
    assert duplicates == 0
    assert set(ids) == want


def test_an_ingest_adapter_restarted_without_its_checkpoint_counts_once_in_the_lake(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path)
    kernel_log, lake = tmp_path / "kern.log", tmp_path / "lake"
    count = 40
    write_xids(kernel_log, 0, count)
    for n in (1, 2):
        adapter = Proc("ingest", ["ingest", "xid", "--log", str(kernel_log), "--once"], env,
                       tmp_path / f"ingest{n}.log").start()
        assert adapter.wait(120) == 0, adapter.tail()
        shutil.rmtree(tmp_path / "sources")  # the checkpoint is lost: everything again
    started = time.monotonic()
    sink = _sink(env, lake, tmp_path / "sink.log")
    try:
        wait_until(lambda: lake_rows(lake, "xid") >= 2 * count, 90, "both copies stored", sink)
        recovered = time.monotonic() - started
    finally:
        assert sink.stop() == 0, sink.tail()
    with Lake(lake) as reader:
        viewed = int(reader.sql("SELECT count(*) FROM xid").rows[0][0])
        distinct = int(reader.sql(
            "SELECT count(*) FROM (SELECT DISTINCT ts, node, pci_bus_id, xid, pid FROM xid)"
        ).rows[0][0])
    stored = lake_rows(lake, "xid")
    reliability.record("infrastructure", "xid adapter restarted without its checkpoint", {
        "in": count, "consumed": stored, "out": viewed, "duplicates": viewed - distinct,
        "lost": count - distinct, "recovery_s": round(recovered, 2),
        "dedupe": "in the views: one row per Xid (stored twice)",
    })
    assert stored == 2 * count  # the adapter sent every Xid twice, at new offsets
    assert viewed == distinct == count
