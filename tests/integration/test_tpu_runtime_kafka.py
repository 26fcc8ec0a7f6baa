"""`fleetpulse ingest tpu-runtime --once` against the libtpu stand-in, into a real Kafka.

Proves the command wiring and the Kafka publisher: TPU chip and ICI samples land on their
topics keyed by slice, acknowledged before the position is committed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kafka import KafkaConsumer

from pipeline import cli
from pipeline.config import Settings, SimSettings
from pipeline.model import IciSample, TpuSample
from pipeline.sim.endpoints.tpu_runtime import TpuRuntimeStandIn
from pipeline.sim.engine import Simulation
from pipeline.wire import codec
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import decode
from pipeline.wire.topics import topic_name
from streams.testing import payloads_of

pytestmark = pytest.mark.kafka


def _read(settings: Settings, suffixes: list[str], count: int) -> dict[str, list[Any]]:
    """The first `count` values of the topics, by topic suffix (waits at most 20 s): a batch
    record's values each count (pipeline/wire/batches.py)."""
    topics = {topic_name(settings.kafka, suffix): suffix for suffix in suffixes}
    consumer = KafkaConsumer(
        *topics, bootstrap_servers=settings.kafka.bootstrap, auto_offset_reset="earliest"
    )
    found: dict[str, list[Any]] = {suffix: [] for suffix in suffixes}
    deadline = time.monotonic() + 20
    try:
        while sum(map(len, found.values())) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    found[topics[record.topic]] += [
                        (record.key, raw, ct) for ct, raw in payloads_of(record)]
    finally:
        consumer.close()
    return found


def test_ingest_command_publishes_to_kafka(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_topics(settings.kafka)
    sim = Simulation(
        SimSettings(
            seed=2,
            duration_s=10,
            gpu_nodes=0,
            tpu_slices=1,
            clusters=1,
            tpu_slice_types=("v6e-16:4x4",),
            random_faults=False,
        )
    )
    [tpu_slice] = sim.fleet.slices
    host = tpu_slice.hosts[1]
    [tick] = list(sim.ticks())
    chips = next(e for e in tick if isinstance(e, TpuSample) and e.node == host.node)
    links = next(e for e in tick if isinstance(e, IciSample) and e.node == host.node)
    with TpuRuntimeStandIn() as server:
        server.update_chips(chips)
        server.update_links(links)
        env = {
            "FLEETPULSE_KAFKA__BOOTSTRAP": settings.kafka.bootstrap,
            "FLEETPULSE_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
            "FLEETPULSE_SOURCES__STATE_DIR": str(tmp_path),
            "FLEETPULSE_METRICS__PORT": "0",  # the default may be another run's
            "FLEETPULSE_SOURCES__TPU_RUNTIME_ENDPOINT": server.address,
            "FLEETPULSE_SOURCES__CLUSTER": tpu_slice.cluster,
            "FLEETPULSE_SOURCES__POOL": tpu_slice.pool,
            "FLEETPULSE_SOURCES__ZONE": tpu_slice.zone,
            "FLEETPULSE_SOURCES__NODE": host.node,
            "FLEETPULSE_SOURCES__TPU_SLICE": tpu_slice.name,
            "FLEETPULSE_SOURCES__TPU_ACCELERATOR_TYPE": tpu_slice.accelerator_type,
            "FLEETPULSE_SOURCES__TPU_TOPOLOGY": tpu_slice.topology,
            "FLEETPULSE_SOURCES__TPU_WORKER_ID": str(host.worker_id),
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.chdir(tmp_path)  # no fleetpulse.toml from the repo
        assert cli.main(["ingest", "tpu-runtime", "--once"]) == 0
    found = _read(settings, ["telemetry.tpu", "telemetry.ici"], count=2)
    [(tpu_key, tpu_value, tpu_type)] = found["telemetry.tpu"]
    [(ici_key, ici_value, ici_type)] = found["telemetry.ici"]
    assert tpu_key == ici_key == f"{tpu_slice.cluster}/{tpu_slice.name}".encode()
    # the adapter writes the fast format by default, marked so any consumer can tell
    assert tpu_type == ici_type == codec.MSGPACK
    assert decode(ici_value, IciSample, content_type=ici_type) == links
    unjobbed = [msgspec.structs.replace(chip, job=None) for chip in chips.chips]
    assert decode(tpu_value, TpuSample, content_type=tpu_type) == msgspec.structs.replace(chips, chips=unjobbed)
    assert (tmp_path / "tpu_runtime.json").exists(), "position committed after the acks"
    assert os.path.getsize(tmp_path / "tpu_runtime.json") > 0
