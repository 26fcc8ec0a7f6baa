"""Exactly once with several writers: three `fleetpulse sink lake` processes in one consumer
group commit into the same Iceberg tables (SQLite catalog, data on s3proxy: deploy/s3/s3.sh)
while findings arrive; one is SIGKILLed at a seeded point and restarted. Each append records
its offsets in the snapshot summary, so the partitions handed to the others (and back) are
replayed from the group's last commit without adding a row twice, and commits lost to another
writer are retried. Counts in = rows out, no duplicates, no loss."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings
from pipeline.lake.iceberg import IcebergWriter, committed_offsets
from pipeline.lake.query import Lake
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import encode
from pipeline.wire.topics import topic_name
from streams.testing import producer
from tests.faults import reliability
from tests.faults.infra import Proc, base_env, seeded_point, wait_until
from tests.iceberg_fixture import iceberg_settings, settings_env
from tests.lake_fixture import FINDINGS

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
TRICKLE_S = 8.0  # findings arrive over this long; the kill falls inside
FINDINGS_IN = 1500


def test_three_iceberg_sinks_one_killed_store_every_row_once(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    create_topics(kafka)
    lake = iceberg_settings(tmp_path, flush_seconds=1)
    IcebergWriter(lake)  # the tables, as the first sink would create them
    env = base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path, **settings_env(lake),
                   FLEETPULSE_LAKE__FLUSH_SECONDS="1")
    sinks = [Proc(f"lake sink {n}", ["sink", "lake"], env, tmp_path / f"s{n}.log")
             for n in range(3)]
    for sink in sinks:
        sink.start()
    for sink in sinks:
        wait_until(sink.ready, 90, f"{sink.name} joined its group", sink)
    findings = [msgspec.structs.replace(FINDINGS[0], finding_id=f"iceberg-w-{n:05d}",
                                        ts=FINDINGS[0].ts + n) for n in range(FINDINGS_IN)]
    topic = topic_name(kafka, "findings")
    kafka_producer = producer(kafka)

    def send() -> None:
        for start in range(0, len(findings), 50):
            for f in findings[start : start + 50]:
                kafka_producer.send(topic, key=f.finding_id.encode(), value=encode(f))
            time.sleep(TRICKLE_S * 50 / len(findings))

    sending = threading.Thread(target=send, daemon=True)
    seed, point = seeded_point("iceberg sinks", 1.0, TRICKLE_S - 1)
    want = {f.finding_id for f in findings}
    try:
        sending.start()
        time.sleep(point)  # the kill's moment, drawn from the seed
        victim = sinks[0]
        assert victim.alive(), victim.tail()
        victim.kill()
        victim.start()
        recovered = wait_until(victim.ready, 120, "the restarted sink is ready", *sinks)
        sending.join(60)
        kafka_producer.flush(60)
        wait_until(lambda: want <= set(_ids(lake)), 120, "every finding in the lake", *sinks)
    finally:
        kafka_producer.close()
        codes = [sink.stop() for sink in sinks]
    ids = _ids(lake)
    duplicates = sum(n - 1 for n in ids.values())
    lost = len(want - set(ids))
    writer = IcebergWriter(lake)
    offsets = committed_offsets(writer.table("findings"))
    snapshots = len(writer.table("findings").metadata.snapshots)
    reliability.record("infrastructure", "three Iceberg lake sinks, one SIGKILLed", {
        "in": len(findings), "out": sum(ids.values()), "lost": lost, "duplicates": duplicates,
        "snapshots": snapshots,
        "commits retried": sum(s.text().count("lost to another writer") for s in sinks),
        "recovery_s": round(recovered, 2), "seed": seed,
        "killed at s": point})
    assert codes == [0, 0, 0], "\n".join(sink.tail() for sink in sinks)
    assert lost == 0 and duplicates == 0
    assert sum(offsets.get((topic, p), 0) for p in range(kafka.partitions)) == len(findings)


def _ids(lake: object) -> Counter[str]:
    with Lake(Path("."), lake) as opened:  # type: ignore[arg-type]
        rows = opened.sql("SELECT finding_id FROM stored_findings").rows
    return Counter(str(row[0]) for row in rows)
