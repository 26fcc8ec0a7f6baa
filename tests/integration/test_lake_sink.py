"""Against the real broker: `fleetpulse sink lake` SIGKILLed mid-write and restarted leaves no
partial file visible and every row exactly once; bad records become dead letters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition

from pipeline.config import KafkaSettings
from pipeline.lake.query import Lake
from pipeline.lake.tables import TABLES
from pipeline.lake.writer import visible_files
from pipeline.model import DeadLetter, Event
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import decode, encode
from pipeline.wire.topics import topic_name
from tests import lake_fixture as fx

pytestmark = pytest.mark.kafka
BAD_RECORDS = [b"not json", b'{"schema": "utilization/1"}', b'{"schema": "finding/2", "ts": 5}']
IDS = {"findings": "finding_id", "actions": "action_id", "capacity": "event_id",
       "withheld": "withheld_id"}


def _key(event: Event) -> bytes:
    for path in ("node", "target.name", "entity.target.name", "zone", "fingerprint"):
        value: object = event
        for part in path.split("."):
            value = getattr(value, part, None)
        if isinstance(value, str):
            return value.encode()
    return b"k"


def _produce(kafka: KafkaSettings) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all", linger_ms=20)
    for table, make in fx.EVERYTHING.items():
        topic = topic_name(kafka, TABLES[table].topic_suffix)
        for event in make():
            producer.send(topic, key=_key(event), value=encode(event))
    for raw in BAD_RECORDS:
        producer.send(topic_name(kafka, "utilization"), key=b"bad", value=raw)
    producer.flush(timeout=60)
    producer.close()


def _sink(
    kafka: KafkaSettings, group: str, lake: Path, log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
        "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "FLEETPULSE_LAKE__GROUP_ID": group,
        "FLEETPULSE_METRICS__PORT": "0",  # two sinks at once, and the default may be taken
        # small flushes of tiny, hard-compressed row groups: many files, each written for long
        # enough that the test can catch one in the act
        "FLEETPULSE_LAKE__FLUSH_ROWS": "200",
        "FLEETPULSE_LAKE__FLUSH_SECONDS": "1",
        "FLEETPULSE_LAKE__ROW_GROUP_ROWS": "2",
        "FLEETPULSE_LAKE__COMPRESSION_LEVEL": "22",
        # the restarted sink gets the killed one's partitions after this long
        "FLEETPULSE_LAKE__SESSION_TIMEOUT_S": "6",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(lake), *extra],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )


def _tmp_files(lake: Path) -> list[Path]:
    """Temporary files under lake/<table>/date=…/hour=…/ (a quick walk: it runs in a tight loop)."""
    found, folders = [], [lake]
    for depth in range(4):
        deeper = []
        for folder in folders:
            try:
                entries = list(os.scandir(folder))
            except FileNotFoundError:
                continue
            for entry in entries:
                if depth == 3 and entry.name.endswith(".tmp"):
                    found.append(Path(entry.path))
                elif depth < 3 and entry.is_dir() and not entry.name.startswith("_"):
                    deeper.append(entry.path)
        folders = deeper
    return found


def _kill_mid_write(process: subprocess.Popen[bytes], lake: Path, log: Path) -> None:
    """SIGKILL the sink the moment a temporary file shows that it is writing."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the sink ended before it could be killed:\n{log.read_text()[-3000:]}")
        if _tmp_files(lake):
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
            return
    process.kill()
    pytest.fail(f"never saw the sink mid-write within 120 s:\n{log.read_text()[-3000:]}")


def test_sigkill_mid_write_then_restart_leaves_every_row_exactly_once(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    create_topics(kafka_settings)
    _produce(kafka_settings)
    lake, log = tmp_path / "lake", tmp_path / "sink.log"
    group = f"lake-{uuid.uuid4().hex[:8]}"

    _kill_mid_write(_sink(kafka_settings, group, lake, log), lake, log)

    # what a reader sees after the crash: only finished files, each complete
    for table in TABLES:
        for path in visible_files(lake, table):
            assert not path.name.startswith(".")
            pq.read_table(path, partitioning=None)  # raises on a truncated file
    with Lake(lake) as reader:
        seen = reader.sql("SELECT count(*) FROM utilization").rows[0][0]
    assert seen < len(fx.utilization()), "the sink was killed after it had finished"

    restarted = _sink(kafka_settings, group, lake, log, "--exit-when-idle", "4")
    assert restarted.wait(timeout=120) == 0, log.read_text()[-3000:]

    with Lake(lake) as reader:
        for table, make in fx.EVERYTHING.items():
            count = reader.sql(f"SELECT count(*) FROM {table}").rows[0][0]
            assert count == len(make()), f"{table}: {count} rows, produced {len(make())}"
        distinct = reader.sql(
            "SELECT count(DISTINCT (node, device, window_start)) FROM utilization").rows[0][0]
        assert distinct == len(fx.utilization())
        for table, column in IDS.items():
            assert reader.sql(f"SELECT count(DISTINCT {column}) FROM {table}").rows[0][0] == len(
                fx.EVERYTHING[table]())
        (row,) = reader.run("fleet_summary", since=None, until=None).rows
    assert row[0] == len(fx.utilization()) // (fx.HOURS * 60)  # devices
    _assert_offsets_committed_to_the_end(kafka_settings, group)
    _assert_dead_letters(kafka_settings)


def _assert_offsets_committed_to_the_end(kafka: KafkaSettings, group: str) -> None:
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        partitions = [
            TopicPartition(topic_name(kafka, spec.topic_suffix), p)
            for spec in TABLES.values() for p in range(kafka.partitions)
        ]
        ends = consumer.end_offsets(partitions)
        committed = {partition: consumer.committed(partition) or 0 for partition in partitions}
        assert committed == ends
    finally:
        consumer.close()


def _assert_dead_letters(kafka: KafkaSettings) -> None:
    consumer = KafkaConsumer(topic_name(kafka, "dlq"), bootstrap_servers=kafka.bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=5000,
                             group_id=f"dlq-{uuid.uuid4().hex[:8]}")
    try:
        letters = [decode(record.value, DeadLetter) for record in consumer]
    finally:
        consumer.close()
    # at least once: a crash between producing and committing may repeat a letter
    assert {letter.offset for letter in letters} and len(
        {(letter.partition, letter.offset) for letter in letters}) == len(BAD_RECORDS)
    assert all(letter.topic == topic_name(kafka, "utilization") for letter in letters)
    assert any("expected" in letter.error for letter in letters)
