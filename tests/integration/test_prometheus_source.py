"""dcgm-exporter stand-in → a real Prometheus server → prometheus-api-client → GpuSamples.

The Prometheus process is started by this module from deploy/prometheus/prometheus.sh on a
free port with a 1 s scrape interval; it fails (never skips) when the binary is missing.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from pipeline.config import SourcesSettings
from pipeline.model import GpuReading, GpuSample
from pipeline.sim.endpoints.dcgm_exporter import DcgmExporter
from pipeline.sources.prometheus import PrometheusSource

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "prometheus" / "prometheus.sh"
pytestmark = pytest.mark.prometheus


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def exporters() -> Iterator[list[DcgmExporter]]:
    started = [DcgmExporter().start(), DcgmExporter().start()]
    yield started
    for exporter in started:
        exporter.stop()


@pytest.fixture(scope="module")
def prometheus_url(
    exporters: list[DcgmExporter], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("prometheus")
    targets = workdir / "targets.json"
    groups = [
        {
            "targets": [exporter.address],
            "labels": {"cluster": "c-test", "pool": f"pool-{i}", "zone": "zone-a"},
        }
        for i, exporter in enumerate(exporters)
    ]
    targets.write_text(json.dumps(groups))
    port = _free_port()
    env = {
        **os.environ,
        "PROMETHEUS_PORT": str(port),
        "PROMETHEUS_SCRAPE_INTERVAL": "1s",
        "PROMETHEUS_TARGETS": str(targets),
        "PROMETHEUS_CACHE_DIR": str(workdir / "cache"),
    }
    subprocess.run(["bash", str(SCRIPT), "start"], env=env, check=True, timeout=90)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, check=True, timeout=60)


def _sample(node: str, ts: int, rng: random.Random, *, gpus: int = 2) -> GpuSample:
    readings = [
        GpuReading(
            index=i,
            uuid=f"GPU-{rng.getrandbits(32):08x}-f531-14ce-0530-1ac21e4b68e{i}",
            pci_bus_id=f"00000000:{0x53 + 0x11 * i:02X}:00.0",
            model="NVIDIA H100 80GB HBM3",
            job="llm-pretrain-4821" if i == 0 else None,
            metrics={
                "DCGM_FI_DEV_GPU_TEMP": float(rng.randint(30, 85)),
                "DCGM_FI_DEV_POWER_USAGE": round(rng.uniform(80, 700), 3),
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": float(rng.randint(10**9, 10**12)),
                "DCGM_FI_DEV_GPU_UTIL": float(rng.randint(0, 100)),
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(rng.random(), 6),
                "DCGM_FI_DEV_XID_ERRORS": 0.0,
            },
        )
        for i in range(gpus)
    ]
    return GpuSample(
        ts=ts,
        cluster="c-test",
        node=node,
        pool="",
        zone="zone-a",
        driver="580.105.08",
        gpus=readings,
    )


def _serve_and_wait(updates: list[tuple[DcgmExporter, GpuSample]], timeout: float = 15.0) -> None:
    """Update, then wait until a scrape that began after the update has been answered."""
    wanted = []
    for exporter, sample in updates:
        exporter.update(sample)
        wanted.append((exporter, exporter.scrapes_started + 1))
    deadline = time.monotonic() + timeout
    for exporter, count in wanted:
        while exporter.scrapes_served < count:
            assert time.monotonic() < deadline, "Prometheus did not scrape the stand-in exporter"
            time.sleep(0.05)


def _close(a: GpuSample, b: GpuSample) -> bool:
    """Equal, with values compared after the exporter's %f formatting (6 decimals)."""
    if msgspec.structs.replace(a, gpus=[]) != msgspec.structs.replace(b, gpus=[]):
        return False
    for left, right in zip(a.gpus, b.gpus, strict=True):
        if msgspec.structs.replace(left, metrics={}) != msgspec.structs.replace(right, metrics={}):
            return False
        if left.metrics.keys() != right.metrics.keys():
            return False
        if any(abs(left.metrics[k] - right.metrics[k]) > 1e-6 for k in left.metrics):
            return False
    return True


def test_scraped_samples_come_back_as_served(
    exporters: list[DcgmExporter], prometheus_url: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    nodes = ["gke-a3-pool-0-k2x9", "gke-a3-pool-1-m4q1"]
    served: list[GpuSample] = []
    for _ in range(3):
        ts = int(time.time() * 1000)
        step = [_sample(node, ts + i, rng) for i, node in enumerate(nodes)]
        served += [msgspec.structs.replace(s, pool=f"pool-{i}") for i, s in enumerate(step)]
        _serve_and_wait(list(zip(exporters, step, strict=True)))
    # one more scrape each, so the last one is committed in the TSDB before we read
    _serve_and_wait([(exporter, exporter.latest()[0]) for exporter in exporters])

    settings = SourcesSettings(
        prometheus_url=prometheus_url,
        prometheus_lag_s=0.0,
        prometheus_max_lookback_s=120.0,
        cluster="default-cluster",
        pool="default-pool",
        zone="default-zone",
        state_dir=str(tmp_path),
    )
    source = PrometheusSource(settings)
    batch = source.poll()
    assert batch.bad == []
    got = {(e.node, e.ts): e for e in batch.events if isinstance(e, GpuSample)}
    want = {(s.node, s.ts): s for s in served}
    assert sorted(got) == sorted(want), "every served sample read back exactly once"
    mismatched = [key for key in want if not _close(got[key], want[key])]
    assert mismatched == [], f"read back differently: {got[mismatched[0]]} != {want[mismatched[0]]}"

    # the position is committed atomically and the next poll reads nothing twice
    source.commit(batch.position)
    assert json.loads((tmp_path / "prometheus.json").read_text())["last_ts_ms"] >= max(want)[1]
    again = PrometheusSource(settings).poll()
    assert [e for e in again.events if (e.node, e.ts) in want] == []  # type: ignore[attr-defined]
