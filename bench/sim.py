"""Simulator throughput: metric samples generated per second (one value of one device).

    .venv/bin/python -m bench.sim [--gpu-nodes 64] [--tpu-slices 4] [--minutes 10] [--repeat 3]

sim.events: Simulation.events() over the run, every sample built as msgspec objects;
sim.jsonl: the same run written as JSONL (codec.encode per event);
floor.objects: building the same GpuSample/GpuReading objects from ready Python lists (no numpy,
no model), the cost the contracts' objects impose whatever the simulator does;
split: share of the events() time spent in the GPU numpy model, GPU object building (incl. the
model's finite-value check) and the TPU/ICI part.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from bench.common import median_seconds, write_result
from pipeline.config import SimSettings
from pipeline.model import Event, GpuReading, GpuSample, IciSample, TpuSample
from pipeline.sim import Simulation, write_jsonl
from pipeline.sim.gpu import GpuTelemetry
from pipeline.sim.tpu import TpuTelemetry


def metric_samples(event: Event) -> int:
    if isinstance(event, GpuSample):
        return sum(len(g.metrics) for g in event.gpus)
    if isinstance(event, TpuSample):
        return sum(len(c.metrics) for c in event.chips)
    if isinstance(event, IciSample):
        return 4 * len(event.links)  # health, flits_tx, flits_rx, errors
    return 0


def _settings(args: argparse.Namespace) -> SimSettings:
    return SimSettings(
        duration_s=args.minutes * 60, gpu_nodes=args.gpu_nodes, tpu_slices=args.tpu_slices,
        intensity=500, seed=7,
    )


def _cpu_seconds(fn: Callable[[], object]) -> float:
    """CPU time of this process (less sensitive than wall time to other loads on the host)."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def _floor_seconds(samples: list[GpuSample]) -> float:
    """Time to build the same GPU objects from ready Python lists (the contracts' own cost)."""
    rows = [
        (s, [(g.index, g.uuid, g.pci_bus_id, g.model, g.job, list(g.metrics), list(g.metrics.values()))
             for g in s.gpus])
        for s in samples
    ]
    start = time.process_time()
    for s, gpus in rows:
        GpuSample(
            ts=s.ts, cluster=s.cluster, node=s.node, pool=s.pool, zone=s.zone, driver=s.driver,
            gpus=[
                GpuReading(index=i, uuid=u, pci_bus_id=p, model=m, job=j, metrics=dict(zip(k, v, strict=True)))
                for i, u, p, m, j, k, v in gpus
            ],
        )
    return time.process_time() - start


def _split(settings: SimSettings) -> dict[str, float]:
    """Where events() spends its time, by timing the parts of the GPU and TPU ticks."""
    timers = {"gpu_model": 0.0, "gpu_objects": 0.0, "tpu": 0.0}
    originals = (GpuTelemetry._metrics, GpuTelemetry._samples, TpuTelemetry.advance,
                 TpuTelemetry.chip_samples, TpuTelemetry.ici_samples)

    def timed(name: str, fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timers[name] += time.perf_counter() - start
        return wrapper

    GpuTelemetry._metrics = timed("gpu_model", originals[0])  # type: ignore[method-assign]
    GpuTelemetry._samples = timed("gpu_objects", originals[1])  # type: ignore[method-assign]
    TpuTelemetry.advance = timed("tpu", originals[2])  # type: ignore[method-assign]
    TpuTelemetry.chip_samples = timed("tpu", originals[3])  # type: ignore[method-assign]
    TpuTelemetry.ici_samples = timed("tpu", originals[4])  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        for _ in Simulation(settings).events():
            pass
        total = time.perf_counter() - start
    finally:
        for owner, name, original in zip(
            (GpuTelemetry, GpuTelemetry, TpuTelemetry, TpuTelemetry, TpuTelemetry),
            ("_metrics", "_samples", "advance", "chip_samples", "ici_samples"),
            originals,
            strict=True,
        ):
            setattr(owner, name, original)
    timers["other"] = total - sum(timers.values())
    return {k: round(v / total, 3) for k, v in timers.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-nodes", type=int, default=64)
    parser.add_argument("--tpu-slices", type=int, default=4)
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    settings = _settings(args)
    events = list(Simulation(settings).events())
    samples = sum(metric_samples(e) for e in events)
    gpu_samples = [e for e in events if isinstance(e, GpuSample)]

    def run_events() -> None:
        for _ in Simulation(settings).events():
            pass

    events_s, _ = median_seconds(run_events, args.repeat)
    cpu_s = statistics.median(_cpu_seconds(run_events) for _ in range(args.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        jsonl_s, _ = median_seconds(lambda: write_jsonl(Simulation(settings), Path(tmp) / "e.jsonl"), args.repeat)
        size = (Path(tmp) / "e.jsonl").stat().st_size
    floor_seconds = statistics.median(_floor_seconds(gpu_samples) for _ in range(args.repeat))
    gpu_metric_samples = sum(metric_samples(e) for e in gpu_samples)
    figures = {
        "events": len(events),
        "metric_samples": samples,
        "sim.events.samples_per_s": round(samples / events_s),
        "sim.events.samples_per_cpu_s": round(samples / cpu_s),
        "sim.jsonl.samples_per_s": round(samples / jsonl_s),
        "sim.jsonl.mb_per_s": round(size / jsonl_s / 1e6, 1),
        "floor.objects.gpu_samples_per_cpu_s": round(gpu_metric_samples / floor_seconds),
        "simulated_x_real_time": round(settings.duration_s / events_s),
        "split": _split(settings),
    }
    path = write_result("sim", figures, msgspec.to_builtins(settings))
    print(msgspec.json.format(msgspec.json.encode(figures)).decode())
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
