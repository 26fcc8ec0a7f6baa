"""Exactly once with several writers: three `fleetpulse sink lake` processes in one consumer
group commit into the same Iceberg tables (SQLite catalog, data on s3proxy: deploy/s3/s3.sh)
while findings arrive, and then:

- one is SIGKILLed at a seeded point and restarted (on a SQLite catalog, and on a PostgreSQL
  one that the writers share over the network: deploy/postgres/postgres.sh);
- the broker (a test's own) is stopped mid-stream and started again;
- the group is reset to the earliest offsets and a sink started again: every record comes
  back, and none is stored again.

Each append records its offsets in the snapshot summary, so the partitions handed to the
others (and back), and batches whose Kafka commit failed, are replayed from the group's last
commit without adding a row twice; commits lost to another writer are retried. Counts in =
rows out, no duplicates, no loss."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, LakeSettings
from pipeline.lake.iceberg import committed_offsets
from pipeline.lake.iceberg_writer import IcebergWriter
from pipeline.lake.query import Lake
from pipeline.model import Finding
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import encode
from pipeline.wire.topics import topic_name
from streams.testing import producer
from tests.faults import reliability
from tests.faults.infra import Broker, Proc, base_env, own_broker, seeded_point, wait_until
from tests.faults.test_infra_replay import _reset_to_earliest
from tests.iceberg_fixture import CATALOGS, iceberg_settings, settings_env
from tests.lake_fixture import FINDINGS

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
__all__ = ["own_broker"]
TRICKLE_S = 8.0  # findings arrive over this long; the kill falls inside
FINDINGS_IN = 1500
OUTAGE_S = 8


def _findings(tag: str) -> list[Finding]:
    return [msgspec.structs.replace(FINDINGS[0], finding_id=f"iceberg-{tag}-{n:05d}",
                                    ts=FINDINGS[0].ts + n) for n in range(FINDINGS_IN)]


def _env(kafka: KafkaSettings, lake: LakeSettings, tmp_path: Path) -> dict[str, str]:
    return base_env(kafka.bootstrap, kafka.topic_prefix, tmp_path, **settings_env(lake),
                    FLEETPULSE_LAKE__FLUSH_SECONDS="1")


def _start_sinks(kafka: KafkaSettings, lake: LakeSettings, tmp_path: Path,
                 env: dict[str, str] | None = None) -> list[Proc]:
    create_topics(kafka)
    IcebergWriter(lake)  # the tables, as the first sink would create them
    env = env or _env(kafka, lake, tmp_path)
    sinks = [Proc(f"lake sink {n}", ["sink", "lake"], env, tmp_path / f"s{n}.log")
             for n in range(3)]
    for sink in sinks:
        sink.start()
    for sink in sinks:
        wait_until(sink.ready, 90, f"{sink.name} joined its group", sink)
    return sinks


def _send(kafka: KafkaSettings, findings: list[Finding], seconds: float) -> None:
    topic = topic_name(kafka, "findings")
    kafka_producer = producer(kafka)
    try:
        for start in range(0, len(findings), 50):
            for f in findings[start : start + 50]:
                kafka_producer.send(topic, key=f.finding_id.encode(), value=encode(f))
            time.sleep(seconds * 50 / len(findings))
        kafka_producer.flush(60)
    finally:
        kafka_producer.close()


def _judge(scenario: str, kafka: KafkaSettings, lake: LakeSettings, sinks: list[Proc],
           findings: list[Finding], figures: dict[str, float | int | str]) -> None:
    want = {f.finding_id for f in findings}
    try:
        wait_until(lambda: want <= set(_ids(lake)), 180, "every finding in the lake", *sinks)
        # what replays brought again, on the sinks alive at the end: records skipped on
        # arrival (below the offsets read at assignment) and rows dropped at commit
        skipped = sum(_metric(sink, "already_in_lake") for sink in sinks)
        dropped = sum(_metric(sink, "iceberg_rows_already_in_lake") for sink in sinks)
    finally:
        codes = [sink.stop() for sink in sinks]
    ids = _ids(lake)
    duplicates = sum(n - 1 for n in ids.values())
    lost = len(want - set(ids))
    table = IcebergWriter(lake).table("findings")
    offsets = committed_offsets(table)
    reliability.record("lake", scenario, {
        "in": len(findings), "out": sum(ids.values()), "lost": lost, "duplicates": duplicates,
        "snapshots": len(table.metadata.snapshots),
        "commits retried": sum(s.text().count("lost to another writer") for s in sinks),
        "replayed records skipped": skipped, "replayed rows dropped at commit": dropped,
        **figures})
    assert codes == [0, 0, 0], "\n".join(sink.tail() for sink in sinks)
    assert lost == 0 and duplicates == 0
    topic = topic_name(kafka, "findings")
    assert sum(offsets.get((topic, p), 0) for p in range(kafka.partitions)) == len(findings)


@pytest.mark.parametrize("catalog", CATALOGS)
def test_three_iceberg_sinks_one_killed_store_every_row_once(
    kafka_settings: KafkaSettings, tmp_path: Path, catalog: str
) -> None:
    kafka = kafka_settings
    lake = iceberg_settings(tmp_path, catalog, flush_seconds=1)
    sinks = _start_sinks(kafka, lake, tmp_path)
    findings = _findings("kill")
    sending = threading.Thread(target=_send, args=(kafka, findings, TRICKLE_S), daemon=True)
    seed, point = seeded_point("iceberg sinks", 1.0, TRICKLE_S - 1)
    try:
        sending.start()
        time.sleep(point)  # the kill's moment, drawn from the seed
        victim = sinks[0]
        assert victim.alive(), victim.tail()
        victim.kill()
        victim.start()
        recovered = wait_until(victim.ready, 120, "the restarted sink is ready", *sinks)
        sending.join(90)
    except BaseException:
        for sink in sinks:
            sink.stop()
        raise
    where = "" if catalog == "sqlite" else ", PostgreSQL catalog"
    _judge(f"three Iceberg lake sinks, one SIGKILLed{where}", kafka, lake, sinks, findings,
           {"recovery_s": round(recovered, 2), "seed": seed, "killed at s": point})


def test_three_iceberg_sinks_across_a_broker_restart_store_every_row_once(
    own_broker: Broker, tmp_path: Path
) -> None:
    kafka = KafkaSettings(bootstrap=own_broker.bootstrap,
                          topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3)
    lake = iceberg_settings(tmp_path, flush_seconds=1)
    sinks = _start_sinks(kafka, lake, tmp_path)
    findings = _findings("broker")
    half = len(findings) // 2
    try:
        _send(kafka, findings[:half], TRICKLE_S / 2)
        own_broker.stop()  # the sinks hold batches they could not commit to the group
        stopped = time.monotonic()
        while time.monotonic() - stopped < OUTAGE_S:
            for sink in sinks:
                assert sink.alive(), sink.tail()
            time.sleep(0.5)
        own_broker.start()
        outage_s = time.monotonic() - stopped
        _send(kafka, findings[half:], TRICKLE_S / 2)
    except BaseException:
        for sink in sinks:
            sink.stop()
        raise
    _judge("three Iceberg lake sinks, broker restarted", kafka, lake, sinks, findings,
           {"outage_s": round(outage_s, 1)})


def test_a_group_reset_to_earliest_stores_nothing_twice_in_the_iceberg_tables(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    kafka = kafka_settings
    lake = iceberg_settings(tmp_path, flush_seconds=1)
    env = _env(kafka, lake, tmp_path)
    sinks = _start_sinks(kafka, lake, tmp_path, env)
    findings = _findings("reset")
    want = {f.finding_id for f in findings}
    try:
        _send(kafka, findings, TRICKLE_S / 2)
        wait_until(lambda: want <= set(_ids(lake)), 180, "every finding in the lake", *sinks)
    finally:
        codes = [sink.stop() for sink in sinks]
    assert codes == [0, 0, 0], "\n".join(sink.tail() for sink in sinks)
    reset = _reset_to_earliest(kafka, env["FLEETPULSE_LAKE__GROUP_ID"])
    assert set(reset.values()) == {0}
    again = Proc("lake sink after the reset", ["sink", "lake"], env, tmp_path / "again.log")
    again.start()
    try:
        wait_until(again.ready, 90, "the sink joined its group", again)
        # every record comes back: each is skipped (the snapshot's offsets say it is in)
        wait_until(lambda: _metric(again, "already_in_lake") >= len(findings), 120,
                   "every replayed record skipped", again)
        skipped = _metric(again, "already_in_lake")
        dropped = _metric(again, "iceberg_rows_already_in_lake")
    finally:
        code = again.stop()
    ids = _ids(lake)
    reliability.record("lake", "Iceberg lake sink group reset to earliest", {
        "in": len(findings), "consumed": 2 * len(findings), "out": sum(ids.values()),
        "duplicates": sum(n - 1 for n in ids.values()), "lost": len(want - set(ids)),
        "replayed records skipped": skipped, "replayed rows dropped at commit": dropped})
    assert code == 0, again.tail()
    assert skipped == len(findings)
    assert Counter(ids) == Counter(want)


def _metric(sink: Proc, field: str) -> int:
    """A lake sink's counter from its /metrics (0 when it has not counted any yet)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{sink.readyz_port()}/metrics",
                                timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(rf"^fleetpulse_lake_sink_{field}(?:_total)? (\S+)$", text, re.MULTILINE)
    return int(float(found[1])) if found else 0


def _ids(lake: LakeSettings) -> Counter[str]:
    with Lake(Path("."), lake) as opened:
        rows = opened.sql("SELECT finding_id FROM stored_findings").rows
    return Counter(str(row[0]) for row in rows)
