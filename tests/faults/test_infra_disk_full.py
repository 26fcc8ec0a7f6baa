"""Infrastructure fault: the disk under `fleetpulse sink lake` fills up, then space returns.

The lake lives on a 2 MiB tmpfs mounted by the test (it runs as root in CI). Records are produced
until the sink reports `disk_full`; meanwhile it must commit no offset, say why in its log, on
/metrics and /readyz, and leave no half-written file where a reader looks. The tmpfs is then
grown to 64 MiB: the sink resumes by itself, and the lake holds every produced row exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition

from pipeline.config import KafkaSettings
from pipeline.lake.tables import TABLES
from pipeline.lake.writer import visible_files
from pipeline.model import Utilization
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import encode
from pipeline.wire.topics import topic_name
from streams.testing import announced_port
from tests.faults import reliability

pytestmark = pytest.mark.kafka
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CHUNK = 4000  # records per round of production
MOST = 40  # rounds before giving up on filling the disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted (lazily, should the sink still hold it) at the end."""
    mount = tmp_path / "lake"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the scenario needs root): {done.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _rows(start: int, count: int) -> list[Utilization]:
    """`count` utilization rows, each with its own id (the node name), over four hours; random
    figures so that Parquet cannot squeeze them to nothing."""
    pick = random.Random(start)
    rows = []
    for n in range(start, start + count):
        util = round(pick.uniform(0, 100), 3)
        rows.append(Utilization(
            window_start=T0 + (n % 4) * 3_600_000, window_s=60, cluster="c1", pool="p",
            zone="z", node=f"n{n:07d}", slice=None, device=str(pick.randrange(8)),
            accelerator="NVIDIA H100 80GB HBM3", job=f"job-{pick.randrange(10**9)}",
            allocated=True, util_mean=util, util_max=min(util + pick.uniform(0, 10), 100.0),
            mem_used_frac=round(pick.random(), 4), power_w_mean=round(pick.uniform(50, 700), 2),
            samples=4))
    return rows


def _produce(producer: KafkaProducer, topic: str, rows: list[Utilization]) -> None:
    for row in rows:
        producer.send(topic, key=row.node.encode(), value=encode(row))
    producer.flush(timeout=60)


def _sink(kafka: KafkaSettings, group: str, lake: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
        "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "FLEETPULSE_LAKE__GROUP_ID": group,
        "FLEETPULSE_METRICS__PORT": "0",
        "FLEETPULSE_LAKE__FLUSH_ROWS": "2000",
        "FLEETPULSE_LAKE__FLUSH_SECONDS": "1",
        "FLEETPULSE_LAKE__COMPRESSION_LEVEL": "1",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(lake)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )



def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _metric(port: int, name: str) -> float:
    """The sum of every sample of `name` (any labels) on /metrics; 0 when absent."""
    total = 0.0
    for line in _get(port, "/metrics")[1].splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _committed(kafka: KafkaSettings, group: str, topic: str) -> tuple[int, int]:
    """(offsets the group has committed, the end offsets), summed over the partitions."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in range(kafka.partitions)]
        ends = consumer.end_offsets(partitions)
        committed = sum(consumer.committed(tp) or 0 for tp in partitions)
        return committed, sum(ends.values())
    finally:
        consumer.close()


def _read_lake(lake: Path) -> Counter[str]:
    """Rows per id in every file a reader would read; each file must be whole."""
    seen: Counter[str] = Counter()
    for path in visible_files(lake, "utilization"):
        seen.update(pq.read_table(path, columns=["node"], partitioning=None).column(0).to_pylist())
    return seen


def _hidden_leftovers(lake: Path) -> list[Path]:
    return [p for p in (lake / "utilization").rglob("*") if p.is_file()
            and not p.name.endswith(".parquet")]


def test_disk_full_under_the_lake_sink_blocks_commits_then_resumes_with_nothing_lost(
    kafka_settings: KafkaSettings, small_disk: Path, tmp_path: Path
) -> None:
    create_topics(kafka_settings)
    topic = topic_name(kafka_settings, TABLES["utilization"].topic_suffix)
    group, log = f"lake-{uuid.uuid4().hex[:8]}", tmp_path / "sink.log"
    producer = KafkaProducer(bootstrap_servers=kafka_settings.bootstrap, acks="all",
                             linger_ms=20)
    sink = _sink(kafka_settings, group, small_disk, log)
    try:
        port = announced_port(log, sink)
        produced = 0
        for _ in range(MOST):  # fill the disk
            _produce(producer, topic, _rows(produced, CHUNK))
            produced += CHUNK
            time.sleep(0.5)
            if _metric(port, "fleetpulse_lake_sink_flush_blocked") == 1:
                break
        assert _metric(port, "fleetpulse_lake_sink_flush_blocked") == 1, (
            f"{produced} records never filled the disk:\n{log.read_text()[-3000:]}")
        # records that arrive while the disk is full must not be lost either
        _produce(producer, topic, _rows(produced, CHUNK))
        produced += CHUNK

        # full: nothing committed meanwhile, the reason everywhere, no partial file visible
        before, end = _committed(kafka_settings, group, topic)
        time.sleep(3)
        during, _ = _committed(kafka_settings, group, topic)
        assert during == before < end
        assert sink.poll() is None, log.read_text()[-3000:]
        assert 'fleetpulse_lake_sink_flush_errors_total{reason="disk_full"}' in _get(
            port, "/metrics")[1]
        status, body = _get(port, "/readyz")
        assert status == 503 and "disk_full" in body, body
        assert "lake blocked (disk_full)" in log.read_text()
        rows_while_full = sum(_read_lake(small_disk).values())  # raises on a truncated file
        assert _hidden_leftovers(small_disk) == []
        errors = _metric(port, "fleetpulse_lake_sink_flush_errors_total")

        # space returns: the sink catches up alone
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
        grown = time.monotonic()
        deadline = grown + 45
        while _committed(kafka_settings, group, topic)[0] < produced:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            assert sink.poll() is None, log.read_text()[-3000:]
            time.sleep(0.3)
        recovered_s = time.monotonic() - grown
        assert _metric(port, "fleetpulse_lake_sink_flush_blocked") == 0
        assert _get(port, "/readyz")[0] == 200
    finally:
        producer.close()
        sink.send_signal(signal.SIGTERM)
        code = sink.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]

    seen = _read_lake(small_disk)
    expected = {f"n{n:07d}" for n in range(produced)}
    lost = len(expected - set(seen))
    duplicates = sum(count - 1 for count in seen.values())
    reliability.record("infrastructure", "disk full under the lake sink", {
        "in": produced, "rows_while_full": rows_while_full, "write_errors": int(errors),
        "out": sum(seen.values()), "lost": lost, "duplicates": duplicates,
        "recovery_s": round(recovered_s, 2),
    })
    assert set(seen) == expected and lost == 0
    assert duplicates == 0
    assert _hidden_leftovers(small_disk) == []
