"""On the real broker: the worker publishes why it did not act (withheld/1 on fleet.withheld),
the records the embedded runtime says for the same events, and `sink lake` makes them one SQL
query (issue 35, item 4).

The simulated fleet's pools are small and the budget is set to let nothing out (floor 0, no
fatal allowance): every fault's cordon is held back, and said so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, load_settings
from pipeline.lake.query import Lake
from pipeline.model import WithheldRecord
from pipeline.wire.topics import topic_name
from streams.testing import (
    TopicReader,
    WorkerProcess,
    create_topics,
    embedded_outputs,
    produce_events,
    scenario,
    worker_env,
)

pytestmark = pytest.mark.kafka
TIGHT = {"FLEETPULSE_POLICY__BUDGET_FLOOR": "0", "FLEETPULSE_POLICY__FATAL_MAX_UNAVAILABLE_PCT": "0"}


def test_the_worker_says_why_it_held_cordons_back_and_the_lake_answers_why_not(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    kafka = KafkaSettings(
        bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3
    )
    settings = msgspec.structs.replace(load_settings(environ=TIGHT), kafka=kafka)
    events = list(scenario(600).events())
    expected = [w for w in embedded_outputs(settings, events).get("withheld", [])
                if isinstance(w, WithheldRecord)]
    assert {w.reason for w in expected} >= {"fatal_ceiling", "budget"}, expected

    env = worker_env(settings, tmp_path, **TIGHT)
    create_topics(env)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    topic = topic_name(kafka, "withheld")
    reader = TopicReader(kafka_bootstrap, [topic])
    try:
        worker.wait_for(r"^fleetpulse worker: assigned .*telemetry", timeout=120)
        produce_events(settings, events)
        reader.until(lambda: len(reader.records[topic]) >= len(expected), timeout=180,
                     what=f"{len(expected)} withheld/1 records on {topic}")
        published = reader.values(topic, WithheldRecord)
        keys = {record.key.decode() for record in reader.records[topic]}
    finally:
        reader.close()
        code = worker.stop()
    assert code == 0, worker.tail()
    assert sorted(published, key=lambda w: w.withheld_id) == sorted(
        expected, key=lambda w: w.withheld_id
    )
    assert keys == {f"{w.target.cluster}/{w.target.name}" for w in expected}  # cluster/target

    lake = tmp_path / "lake"
    sink = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(lake),
         "--exit-when-idle", "4"],
        env={**os.environ, "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
             "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
             "FLEETPULSE_LAKE__GROUP_ID": f"lake-{uuid.uuid4().hex[:8]}",
             "FLEETPULSE_METRICS__PORT": "0", "FLEETPULSE_LAKE__FLUSH_SECONDS": "1"},
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert sink.returncode == 0, sink.stdout[-3000:] + sink.stderr[-3000:]
    held = expected[0]
    with Lake(lake) as reader_:
        rows = reader_.run("why_not_removed", target=held.target.name).records()
    assert [(r["reason"], r["detail"], r["acted_at"]) for r in rows] == [
        (w.reason, w.detail, None) for w in expected if w.target == held.target
    ], rows
    assert rows[0]["ts"] == datetime.fromtimestamp(held.ts / 1000, UTC).replace(tzinfo=None)
