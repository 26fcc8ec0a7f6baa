"""Simulated GPU nodes → dcgm-exporter stand-ins → a real Prometheus → prometheus-api-client →
the prometheus source → GpuSamples equal to what the simulator produced.

The Prometheus process is started by this module from deploy/prometheus/prometheus.sh on a
free port with a 1 s scrape interval; it fails (never skips) when the binary is missing.
"""

from __future__ import annotations

import http.server
import json
import math
import os
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest

from pipeline.config import HttpClientSettings, SimSettings, SourcesSettings
from pipeline.model import FabricSample, GpuReading, GpuSample
from pipeline.sim.endpoints.dcgm_exporter import DcgmExporter
from pipeline.sim.endpoints.fleet import SimEndpoints
from pipeline.sim.engine import Simulation
from pipeline.sim.fleet import GpuNode
from pipeline.sources.prometheus import PrometheusSource

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "prometheus" / "prometheus.sh"
pytestmark = pytest.mark.prometheus


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Simulation, SimEndpoints]]:
    """Two simulated GPU nodes whose event time is the wall clock, behind their exporters."""
    now_ms = int(time.time() * 1000)
    settings = SimSettings(
        seed=11,
        start_ms=now_ms - now_ms % 1000,
        duration_s=6,
        gpu_nodes=2,
        tpu_slices=0,
        clusters=1,
        gpu_interval_s=2,
        tpu_interval_s=2,
        ici_interval_s=2,
        random_faults=False,
    )
    sim = Simulation(settings)
    with SimEndpoints(sim.fleet, tmp_path_factory.mktemp("sim")) as endpoints:
        yield sim, endpoints


@pytest.fixture(scope="module")
def prometheus_url(
    fleet: tuple[Simulation, SimEndpoints], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    _, endpoints = fleet
    port = _free_port()
    env = {
        **os.environ,
        "PROMETHEUS_PORT": str(port),
        "PROMETHEUS_SCRAPE_INTERVAL": "1s",
        "PROMETHEUS_TARGETS": str(endpoints.out / "prometheus-targets.json"),
        "PROMETHEUS_CACHE_DIR": str(tmp_path_factory.mktemp("prometheus")),
    }
    subprocess.run(["bash", str(SCRIPT), "start"], env=env, check=True, timeout=90)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, check=True, timeout=60)


def _wait_for_scrapes(exporters: list[DcgmExporter], timeout: float = 15.0) -> None:
    """Wait until every exporter answered a scrape that began after now."""
    wanted = [(exporter, exporter.scrapes_started + 1) for exporter in exporters]
    deadline = time.monotonic() + timeout
    for exporter, count in wanted:
        while exporter.scrapes_served < count:
            assert time.monotonic() < deadline, "Prometheus did not scrape the stand-in exporter"
            time.sleep(0.05)


def _near(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def _close(a: GpuSample, b: GpuSample) -> bool:
    """Equal, with values compared after the exporter's %f formatting (6 decimals)."""
    if msgspec.structs.replace(a, gpus=[]) != msgspec.structs.replace(b, gpus=[]):
        return False
    for left, right in zip(a.gpus, b.gpus, strict=True):
        if msgspec.structs.replace(left, metrics={}) != msgspec.structs.replace(right, metrics={}):
            return False
        if left.metrics.keys() != right.metrics.keys():
            return False
        if any(not _near(left.metrics[k], right.metrics[k]) for k in left.metrics):
            return False
    return True


def test_scraped_samples_come_back_as_served(
    fleet: tuple[Simulation, SimEndpoints], prometheus_url: str, tmp_path: Path
) -> None:
    sim, endpoints = fleet
    exporters = list(endpoints.exporters.values())
    served: list[GpuSample] = []
    ports: list[FabricSample] = []
    for tick in sim.ticks():
        for event in tick:
            endpoints.dispatch(event)
        served += [e for e in tick if isinstance(e, GpuSample)]
        ports += [e for e in tick if isinstance(e, FabricSample)]
        _wait_for_scrapes(exporters)
    _wait_for_scrapes(exporters)  # the scrape after the last one: that one is in the TSDB now
    assert len(served) == 6

    settings = SourcesSettings(
        prometheus_url=prometheus_url,
        prometheus_lag_s=0.0,
        prometheus_max_lookback_s=120.0,
        cluster="default-cluster",
        pool="default-pool",
        zone="default-zone",
        state_dir=str(tmp_path),
    )
    last_ms = max(s.ts for s in served)
    source = PrometheusSource(settings, clock=lambda: last_ms / 1000 + 0.5)
    batch = source.poll()
    assert batch.bad == []
    got = {(e.node, e.ts): e for e in batch.events if isinstance(e, GpuSample)}
    want = {(s.node, s.ts): s for s in served}
    assert sorted(got) == sorted(want), "every served sample read back exactly once"
    mismatched = [key for key in want if not _close(got[key], want[key])]
    assert mismatched == [], f"read back differently: {got[mismatched[0]]} != {want[mismatched[0]]}"
    # the jobs' own per-rank step compute time (sources.prometheus_step_metric), a series of
    # its own joined into the readings (compared above): one node's job publishes it, one not
    stepped = [key for key, s in want.items() if any(g.step_compute_s for g in s.gpus)]
    assert 0 < len(stepped) < len(want)
    assert all(g.step_compute_s for key in stepped for g in got[key].gpus)
    # node_exporter's ports of the same nodes (sources.prometheus_fabric): IB ports by HCA and
    # the IPoIB netdevs as ports of their own, every value as served
    fabric = {(e.node, e.ts): e for e in batch.events if isinstance(e, FabricSample)}
    assert sorted(fabric) == sorted((p.node, p.ts) for p in ports)
    for sent in ports:
        back = {p.key: p.metrics for p in fabric[(sent.node, sent.ts)].ports}
        for port in sent.ports:
            ib = {k: v for k, v in port.metrics.items() if k.startswith("node_infiniband_")}
            net = {k: v for k, v in port.metrics.items() if k.startswith("node_network_")}
            assert back[port.key] == ib and back[f"{port.netdev}:1"] == net

    # the position is committed atomically and the next poll reads nothing twice
    source.commit(batch.position)
    assert json.loads((tmp_path / "prometheus.json").read_text())["last_ts_ms"] >= last_ms
    again = PrometheusSource(settings, clock=lambda: last_ms / 1000 + 5).poll()
    assert again.events == [] and again.bad == []


def _generations_sample(node: GpuNode, ts: int, mig: bool) -> GpuSample:
    """One node as an exporter before 2024 prints it (no pci_bus_id), or as a MIG node prints
    it (GPU 0 in two GPU instances, plus GPU 1 whole)."""
    uuids = ["GPU-0a1b2c3d-0000-4000-8000-00000000000" + str(i) for i in range(2)]
    if mig:
        readings = [
            GpuReading(index=0, uuid=uuids[0], pci_bus_id="00000000:18:00.0", model="A100",
                       job=f"job-{i}", mig_instance=i, mig_profile="3g.40gb",
                       metrics={"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.25 * i})
            for i in (1, 2)
        ]
        readings.append(GpuReading(index=1, uuid=uuids[1], pci_bus_id="00000000:2a:00.0",
                                   model="A100", metrics={"DCGM_FI_DEV_GPU_TEMP": 40.0}))
    else:
        readings = [GpuReading(index=i, uuid=uuids[i], model="V100", job="old-job",
                               metrics={"DCGM_FI_DEV_GPU_TEMP": 30.0 + i}) for i in range(2)]
    return GpuSample(ts=ts, cluster=node.cluster, node=node.name, pool=node.pool, zone=node.zone,
                     driver="535.104.05", gpus=readings)


def test_older_exporters_and_mig_come_back_through_prometheus(
    fleet: tuple[Simulation, SimEndpoints], prometheus_url: str, tmp_path: Path
) -> None:
    sim, endpoints = fleet
    nodes = list(sim.fleet.gpu_nodes)[:2]
    served: list[GpuSample] = []
    for _ in range(2):
        ts = int(time.time() * 1000)
        for node, mig in zip(nodes, (False, True), strict=True):
            sample = _generations_sample(node, ts, mig)
            endpoints.exporters[node.name].update(sample)
            served.append(sample)
        _wait_for_scrapes([endpoints.exporters[n.name] for n in nodes])
    _wait_for_scrapes([endpoints.exporters[n.name] for n in nodes])

    settings = SourcesSettings(
        prometheus_url=prometheus_url,
        prometheus_lag_s=0.0,
        prometheus_max_lookback_s=60.0,
        state_dir=str(tmp_path),
    )
    last_ms = max(s.ts for s in served)
    batch = PrometheusSource(settings, clock=lambda: last_ms / 1000 + 0.5).poll()
    assert batch.bad == []
    got = {(e.node, e.ts): e for e in batch.events if isinstance(e, GpuSample)}
    for want in served:
        assert got[(want.node, want.ts)] == want  # no pci_bus_id; MIG instances kept apart


class _RecordingProxy(http.server.BaseHTTPRequestHandler):
    """Forwards each GET to the real Prometheus and keeps the request headers it received."""

    upstream = ""
    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers.items()))
        with urllib.request.urlopen(self.upstream + self.path, timeout=10) as answer:
            body = answer.read()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_auth_headers_arrive_and_the_selector_reads_one_shard(
    fleet: tuple[Simulation, SimEndpoints], prometheus_url: str, tmp_path: Path
) -> None:
    sim, endpoints = fleet
    nodes = list(sim.fleet.gpu_nodes)[:2]
    ts = int(time.time() * 1000)
    for node in nodes:
        endpoints.exporters[node.name].update(_generations_sample(node, ts, mig=False))
    _wait_for_scrapes([endpoints.exporters[n.name] for n in nodes])
    _wait_for_scrapes([endpoints.exporters[n.name] for n in nodes])

    class Proxy(_RecordingProxy):
        upstream = prometheus_url
        seen: ClassVar[list[dict[str, str]]] = []

    handler = Proxy
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("prom-reader-token-5e1f\n")
    try:
        shard = endpoints.exporters[nodes[0].name].address  # one node's scrape target
        settings = SourcesSettings(
            prometheus_url=f"http://127.0.0.1:{server.server_address[1]}",
            prometheus_lag_s=0.0,
            prometheus_max_lookback_s=30.0,
            prometheus_http=HttpClientSettings(bearer_token_file=str(token)),
            prometheus_headers={"X-Scope-OrgID": "team-a"},
            prometheus_selector=f'{{instance="{shard}"}}',
            state_dir=str(tmp_path),
        )
        batch = PrometheusSource(settings, clock=lambda: ts / 1000 + 0.5).poll()
    finally:
        server.shutdown()
        server.server_close()
    assert len(handler.seen) == 3  # the DCGM series, the jobs' step times, node_exporter's ports
    for headers in handler.seen:
        assert headers["Authorization"] == "Bearer prom-reader-token-5e1f"
        assert headers["X-Scope-OrgID"] == "team-a"
    assert batch.bad == []
    got = {e.node for e in batch.events if isinstance(e, GpuSample)}
    assert got == {nodes[0].name}, "the selector keeps the other node's series out"
    # without the selector the same window holds both nodes: the selector did the restricting
    unsharded = msgspec.structs.replace(
        settings, prometheus_url=prometheus_url, prometheus_selector="",
        prometheus_http=HttpClientSettings(),
    )
    everything = PrometheusSource(unsharded, clock=lambda: ts / 1000 + 0.5).poll()
    assert {e.node for e in everything.events if isinstance(e, GpuSample)} >= {
        n.name for n in nodes
    }
