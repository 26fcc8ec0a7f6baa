"""A Prometheus adapter poll's cost, against a real Prometheus scraping generated exporters.

    python -m bench.bench_prometheus [--gpus 1000,2000,4000] [--shards 4] [--per-query 250]

The simulator's dcgm-exporter stand-ins (pipeline/sim/endpoints/dcgm_exporter.py, in a child
process so their rendering does not share the measuring process) serve `gpus / 8` nodes, each
a copy of a simulated node (8 GPUs, the simulator's 36 DCGM fields) under its own name and
UUIDs, with a `node` label; the Debian `prometheus` (deploy/prometheus/prometheus.sh) scrapes
them every 15 s with its own timestamps (each stand-in's text rendered once: the nodes do
not change, and one Python process serves the whole fleet). Each poll reads the last 15 s: one point per series. Figures are scaled by the GPUs a poll
actually read (a Prometheus that cannot keep up with its scrapes holds fewer: reported).
Measured per poll, in the measuring thread (CPU: RUSAGE_THREAD) and in the Prometheus process:

- raw:      one HTTP request of the unsharded query, the bytes read and not decoded (baseline);
- json:     the same through prometheus-api-client's custom_query (response.json()) and
            parse_series: the adapter as it was before prometheus_read.py;
- adapter:  PrometheusSource.poll(), unsharded (msgspec decode);
- sharded:  N adapters (shard i/N, prometheus_nodes_per_query), one after another: their sum
            and the largest one.

Reported per 10k GPUs (scaled from the largest size read whole; the sizes show whether the
cost is linear) and
as ratios to raw measured in the same run. Writes bench/results/prometheus.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from bench.common import machine
from pipeline.config import SimSettings, SourcesSettings
from pipeline.model import GpuSample
from pipeline.sim.endpoints.dcgm_exporter import DcgmExporter
from pipeline.sim.engine import Simulation
from pipeline.sources.prometheus import PrometheusSource, parse_series, series_selector
from pipeline.sources.prometheus_series import Identity

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "deploy" / "prometheus" / "prometheus.sh"
RESULTS = REPO / "bench" / "results" / "prometheus.json"
SCRAPE_S = 15
EXPORTERS = 16


def node_samples(gpus: int) -> list[GpuSample]:
    """`gpus / 8` nodes, each a simulated node's scrape under a name and UUIDs of its own."""
    sim = Simulation(SimSettings(seed=7, duration_s=30, gpu_nodes=16, tpu_slices=0,
                                 random_faults=False))  # fmt: skip
    models = next(t for t in ([e for e in tick if isinstance(e, GpuSample)] for tick in sim.ticks())
                  if t)  # fmt: skip
    out = []
    for i in range(gpus // 8):
        model = models[i % len(models)]
        readings = [msgspec.structs.replace(g, uuid=f"GPU-{i:08d}-{g.index:04d}-4000-8000-0000")
                    for g in model.gpus]  # fmt: skip
        out.append(msgspec.structs.replace(model, node=f"bench-gpu-{i:06d}", gpus=readings))
    return out


class _Rendered(DcgmExporter):
    """A stand-in whose nodes do not change: its text rendered once, not at every scrape (one
    process renders for a whole fleet; Prometheus still parses and stores every scrape)."""

    _text = ""

    def render(self) -> str:
        self._text = self._text or super().render()
        return self._text


def _serve(gpus: int, addresses: Any, stop: Any) -> None:
    exporters = [_Rendered(timestamps=False, hostname_label="node") for _ in range(EXPORTERS)]
    for i, sample in enumerate(node_samples(gpus)):
        exporters[i % EXPORTERS].update(sample)
    for exporter in exporters:
        exporter.render()
        exporter.start()
    addresses.put([e.address for e in exporters])
    stop.wait()
    for exporter in exporters:
        exporter.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def fleet(gpus: int) -> Iterator[tuple[str, int]]:
    """(Prometheus URL, its pid) once every exporter's series are in it."""
    context = multiprocessing.get_context("fork")
    addresses, stop = context.Queue(), context.Event()
    child = context.Process(target=_serve, args=(gpus, addresses, stop), daemon=True)
    child.start()
    work = Path(tempfile.mkdtemp(prefix="bench-prometheus-"))
    targets = work / "targets.json"
    targets.write_text(json.dumps([{"targets": addresses.get(timeout=600)}]))
    port = _free_port()
    env = {**os.environ, "PROMETHEUS_PORT": str(port), "PROMETHEUS_CACHE_DIR": str(work),
           "PROMETHEUS_SCRAPE_INTERVAL": f"{SCRAPE_S}s", "PROMETHEUS_TARGETS": str(targets)}
    subprocess.run(["bash", str(SCRIPT), "start"], env=env, check=True, timeout=120)
    try:
        time.sleep(2.5 * SCRAPE_S)  # two scrapes of every target in
        yield f"http://127.0.0.1:{port}", int((work / "prometheus.pid").read_text())
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, check=True, timeout=120)
        stop.set()
        child.join(30)


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(pid: int, run: Callable[[], int]) -> dict[str, float]:
    """Wall and CPU seconds of `run` (this thread, and the Prometheus process), its bytes."""
    cpu, server, wall = resource.getrusage(resource.RUSAGE_THREAD), _process_cpu(pid), time.time()
    size = run()
    wall, after = time.time() - wall, resource.getrusage(resource.RUSAGE_THREAD)
    return {"wall_s": wall,
            "cpu_s": after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime,
            "prometheus_cpu_s": _process_cpu(pid) - server, "bytes": size}  # fmt: skip


def _settings(url: str, **extra: Any) -> SourcesSettings:
    return SourcesSettings(prometheus_url=url, prometheus_lag_s=0.0,
                           prometheus_max_lookback_s=float(SCRAPE_S), prometheus_fabric=False,
                           prometheus_step_metric="", state_dir=tempfile.mkdtemp(),
                           **extra)  # fmt: skip


def modes(url: str, args: argparse.Namespace, now: float) -> dict[str, Callable[[], int]]:
    import requests
    from prometheus_api_client import PrometheusConnect

    query = f"{series_selector()}[{SCRAPE_S * 1000}ms]"
    params = {"query": query, "time": f"{now:.3f}"}
    identity = Identity("c1", "p1", "z1")
    start_ms = int(now * 1000) - SCRAPE_S * 1000

    def raw() -> int:
        return len(requests.get(f"{url}/api/v1/query", params=params, timeout=300).content)

    def old_json() -> int:
        result = PrometheusConnect(url=url).custom_query(query, params={"time": params["time"]})
        return len(parse_series(result, identity, after_ms=start_ms).events)

    def adapter(**extra: Any) -> Callable[[], int]:
        def poll() -> int:
            source = PrometheusSource(_settings(url, **extra), clock=lambda: now)
            try:
                return len(source.poll().events)
            finally:
                source.close()

        return poll

    shards = {f"shard{i}": adapter(prometheus_shard=f"{i}/{args.shards}",
                                   prometheus_nodes_per_query=args.per_query)
              for i in range(args.shards)}  # fmt: skip
    return {"raw": raw, "json": old_json, "adapter": adapter(), **shards}


def one_size(gpus: int, args: argparse.Namespace) -> dict[str, Any]:
    with fleet(gpus) as (url, pid):
        now = time.time()
        runs: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.repeat):
            for name, run in modes(url, args, now).items():
                runs.setdefault(name, []).append(measured(pid, run))
    best = {name: min(rs, key=lambda r: r["wall_s"]) for name, rs in runs.items()}
    shard_rows = [row for name, row in best.items() if name.startswith("shard")]
    best["sharded_sum"] = {k: sum(r[k] for r in shard_rows) for k in shard_rows[0]}
    best["sharded_max"] = {k: max(r[k] for r in shard_rows) for k in shard_rows[0]}
    for name in [n for n in best if n.startswith("shard") and n[5:].isdigit()]:
        del best[name]
    read = int(best["adapter"]["bytes"]) * 8  # the adapter's samples: one per node
    return {"gpus": gpus, "gpus_read": read, "series_read": read * 36, "modes": best}


def per_10k(size: dict[str, Any]) -> dict[str, Any]:
    scale = 10_000 / size["gpus_read"]
    raw = size["modes"]["raw"]
    return {
        name: {"wall_s": round(row["wall_s"] * scale, 3), "cpu_s": round(row["cpu_s"] * scale, 3),
               "prometheus_cpu_s": round(row["prometheus_cpu_s"] * scale, 3),
               "wall_vs_raw": round(row["wall_s"] / raw["wall_s"], 2),
               "cpu_vs_raw": round(row["cpu_s"] / raw["cpu_s"], 2)}
        for name, row in size["modes"].items()
    } | {"raw_mb": round(raw["bytes"] * scale / 1e6, 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="1000,2000,4000")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--per-query", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [one_size(int(g), args) for g in args.gpus.split(",")]
    complete = [s for s in sizes if s["gpus_read"] == s["gpus"]] or sizes
    result = {"benchmark": "prometheus", "settings": vars(args), "machine": machine(),
              "sizes": sizes, "per_10k_gpus": per_10k(complete[-1]),
              "per_10k_from_gpus": complete[-1]["gpus_read"]}  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["per_10k_gpus"], indent=2))
    return result


if __name__ == "__main__":
    main()
