"""N Prometheus adapters on disjoint shards (sources.prometheus_shard "i/N") against a real
Prometheus scraping the simulator's exporters: together they read what one adapter reads,
no node twice, none missed, each in bounded queries (prometheus_nodes_per_query); the nodes
whose series lack the node label are shard 0's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from pipeline.config import SimSettings, SourcesSettings
from pipeline.model import Event, FabricSample, GpuSample
from pipeline.sim.endpoints.dcgm_exporter import DcgmExporter
from pipeline.sim.engine import Simulation
from pipeline.sources.prometheus import PrometheusSource

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "prometheus" / "prometheus.sh"
pytestmark = pytest.mark.prometheus
LABELLED, UNLABELLED = 23, 2  # nodes whose DCGM series carry `node`, and nodes without it


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A Prometheus that scraped one tick of 25 simulated nodes: 23 behind an exporter that
    labels them `node` (as a Kubernetes scrape relabels), 2 behind one that does not."""
    now_ms = int(time.time() * 1000)
    sim = Simulation(SimSettings(seed=21, start_ms=now_ms - now_ms % 1000, duration_s=2,
                                 gpu_nodes=LABELLED + UNLABELLED, tpu_slices=0, clusters=1,
                                 gpu_interval_s=2, random_faults=False))  # fmt: skip
    tick = next(iter(sim.ticks()))
    labelled, unlabelled = DcgmExporter(hostname_label="node"), DcgmExporter()
    nodes = sorted({e.node for e in tick if isinstance(e, GpuSample)})
    for event in tick:
        if isinstance(event, GpuSample | FabricSample):
            exporter = labelled if nodes.index(event.node) < LABELLED else unlabelled
            if exporter is labelled or isinstance(event, GpuSample):
                exporter.update(event)
    out = tmp_path_factory.mktemp("shards")
    targets = out / "targets.json"
    targets.write_text(json.dumps([{"targets": [e.address], "labels": {"cluster": "c1"}}
                                   for e in (labelled, unlabelled)]))  # fmt: skip
    port = _free_port()
    env = {**os.environ, "PROMETHEUS_PORT": str(port), "PROMETHEUS_SCRAPE_INTERVAL": "1s",
           "PROMETHEUS_TARGETS": str(targets), "PROMETHEUS_CACHE_DIR": str(out / "prom")}
    with labelled, unlabelled:
        subprocess.run(["bash", str(SCRIPT), "start"], env=env, check=True, timeout=90)
        try:
            for exporter in (labelled, unlabelled):
                deadline = time.monotonic() + 20
                while exporter.scrapes_served < 2:
                    assert time.monotonic() < deadline, "Prometheus did not scrape"
                    time.sleep(0.05)
            yield f"http://127.0.0.1:{port}", max(e.ts for e in tick)  # type: ignore[attr-defined]
        finally:
            subprocess.run(["bash", str(SCRIPT), "stop"], env=env, check=True, timeout=60)


def _poll(url: str, ts: int, tmp: Path, **settings: object) -> list[Event]:
    config = SourcesSettings(prometheus_url=url, prometheus_lag_s=0.0,
                             prometheus_max_lookback_s=60.0, state_dir=str(tmp),
                             **settings)  # type: ignore[arg-type]  # fmt: skip
    source = PrometheusSource(config, clock=lambda: ts / 1000 + 1)
    try:
        batch = source.poll()
    finally:
        source.close()
    assert batch.bad == []
    return list(batch.events)


def _keys(events: list[Event]) -> list[tuple[str, str, int]]:
    return sorted((type(e).__name__, e.node, e.ts) for e in events)  # type: ignore[attr-defined]


@pytest.mark.parametrize("count", [1, 3, 4])
def test_n_shards_read_every_node_once(scraped: tuple[str, int], tmp_path: Path,
                                       count: int) -> None:  # fmt: skip
    url, ts = scraped
    whole = _poll(url, ts, tmp_path)
    assert len({e.node for e in whole if isinstance(e, GpuSample)}) == LABELLED + UNLABELLED
    parts = [_poll(url, ts, tmp_path, prometheus_shard=f"{i}/{count}",
                   prometheus_nodes_per_query=4) for i in range(count)]  # fmt: skip
    joined = [e for part in parts for e in part]
    assert _keys(joined) == _keys(whole)  # no sample twice, none missed
    by_key = {(type(e).__name__, e.node, e.ts): e for e in whole}  # type: ignore[attr-defined]
    for event in joined:  # and each read the same, GPU readings and ports alike
        assert msgspec.to_builtins(event) == msgspec.to_builtins(
            by_key[(type(event).__name__, event.node, event.ts)])  # type: ignore[attr-defined]
    if count > 1:
        assert all(any(isinstance(e, GpuSample) for e in part) for part in parts)
        unlabelled = {e.node for e in whole if isinstance(e, GpuSample)} - {
            e.node for e in whole if isinstance(e, FabricSample)}  # fmt: skip
        assert len(unlabelled) == UNLABELLED
        first = {e.node for e in parts[0] if isinstance(e, GpuSample)}
        assert unlabelled <= first  # series without `node`: shard 0's


def test_bounded_queries_alone_read_the_same(scraped: tuple[str, int], tmp_path: Path) -> None:
    url, ts = scraped
    whole = _poll(url, ts, tmp_path)
    chunked = _poll(url, ts, tmp_path, prometheus_nodes_per_query=3)
    assert _keys(chunked) == _keys(whole)
