"""fleet.capacity into the lake on the real broker: the lake sink consumes the capacity stage's
snapshots (capacity_snapshot/1) into `capacity_snapshots`, and `fleetpulse capacity` shows them.
On both lake backends: local Parquet, and Iceberg on s3proxy (tests/iceberg_fixture.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer

from pipeline.config import KafkaSettings
from pipeline.model import CapacitySnapshot
from pipeline.wire import codec
from pipeline.wire.admin import create_topics
from pipeline.wire.topics import capacity_key, topic_name
from tests import lake_fixture as fx
from tests.iceberg_fixture import BACKENDS, iceberg_settings, settings_env

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_lake_sink_keeps_capacity_snapshots_and_capacity_shows_the_latest(
    kafka_settings: KafkaSettings, tmp_path: Path, backend: str
) -> None:
    create_topics(kafka_settings)
    producer = KafkaProducer(bootstrap_servers=kafka_settings.bootstrap, acks="all")
    topic = topic_name(kafka_settings, "capacity")
    for snapshot in fx.CAPACITY_SNAPSHOTS:
        producer.send(topic, key=capacity_key(snapshot).encode(), value=codec.encode(snapshot))
    # the utilization the lake's `until` comes from (the end of its newest window)
    utilization = topic_name(kafka_settings, "utilization")
    for row in fx.utilization()[-10:]:
        producer.send(utilization, key=row.node.encode(), value=codec.encode(row))
    producer.flush(timeout=60)
    producer.close()
    lake = tmp_path / "lake"
    env = {**os.environ, "FLEETPULSE_KAFKA__BOOTSTRAP": kafka_settings.bootstrap,
           "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka_settings.topic_prefix,
           "FLEETPULSE_LAKE__GROUP_ID": f"lake-{uuid.uuid4().hex[:8]}",
           "FLEETPULSE_METRICS__PORT": "0"}  # fmt: skip
    if backend == "iceberg":
        lake.mkdir()
        env.update(settings_env(iceberg_settings(lake)))
    sink = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(lake),
         "--exit-when-idle", "3"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert sink.returncode == 0, sink.stderr[-3000:]
    shown = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "capacity", "--lake", str(lake), "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    records = [codec.decode(line.encode(), CapacitySnapshot) for line in shown.stdout.splitlines()]
    assert records == [fx.CAPACITY_SNAPSHOTS[2]]  # z-a's latest, exactly as published
    assert "from the capacity stage's snapshots" in shown.stderr
    every = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "sql", "--lake", str(lake),
         "SELECT count(*) AS n FROM capacity_snapshots"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert every.returncode == 0, every.stderr
    assert str(len(fx.CAPACITY_SNAPSHOTS)) in every.stdout.split()
