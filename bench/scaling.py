"""Scaling: metric samples per second through one worker against three, on twelve partitions.

    python -m bench --only scaling        # writes bench/results/scaling.json
    python -m bench.scaling --quick       # a shorter fleet run, fewer repetitions

The same simulated telemetry is produced once into private twelve-partition topics; then a
fresh consumer group of N `fleetpulse worker` processes (N = 1, then 3) works it off, timed from
the moment every worker of the group says it owns partitions until the group has committed the
last input record (a worker commits only past acknowledged outputs). The figure is wall-clock
samples per second, and 3 workers against 1 as a ratio. On a machine with fewer cores than
workers the ratio says how much the workers' waiting on the broker overlaps, not how far the
pipeline scales: read it with the machine's core count (in the result file). Correctness of a
scaled group is tested in tests/faults/test_infra_scaling.py; nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from kafka import KafkaAdminClient

from bench import broker
from bench.common import load_average, ratio, result_name
from bench.common import write_result as _write
from bench.sim import metric_samples
from pipeline.config import Settings, SimSettings
from pipeline.sim.engine import Simulation
from pipeline.wire.kafka import client_kwargs

PARTITIONS = 12
WORKERS = (1, 3)


def fleet(quick: bool) -> SimSettings:
    """The default fleet (64 GPU nodes, 4 TPU slices), fault model rates."""
    return SimSettings(duration_s=120 if quick else 300)


def group_run(settings: Settings, ends: dict[Any, int], workers: int, workdir: Path,
              tag: str) -> float:
    """Wall seconds for a fresh group of `workers` to commit every record in `ends`."""
    group = msgspec.structs.replace(settings.worker,
                                    group_id=f"{settings.kafka.topic_prefix}-{tag}")
    run = msgspec.structs.replace(settings, worker=group)
    procs = [broker.Worker(run, workdir / f"{tag}-w{i}").start() for i in range(workers)]
    admin = KafkaAdminClient(**client_kwargs(settings.kafka))
    total = sum(ends.values())
    try:
        for proc in procs:
            proc.wait_assigned(600)
        start = time.perf_counter()
        deadline = start + 1800
        while procs[0].committed(admin, ends) < total:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"group {tag} did not commit {total} records: "
                                   f"{procs[0].tail()}")
            time.sleep(0.1)
        return time.perf_counter() - start
    finally:
        admin.close()
        for proc in procs:
            proc.stop()


def run(quick: bool) -> dict[str, Any]:
    repeat = 1 if quick else 2
    settings = broker.bench_settings("scaling")
    settings = msgspec.structs.replace(
        settings, kafka=msgspec.structs.replace(settings.kafka, partitions=PARTITIONS))
    events = list(Simulation(fleet(quick)).events())
    batch = broker.records(settings, events)
    samples = sum(metric_samples(e) for e in events)
    figures: dict[str, Any] = {"records": len(batch), "metric_samples": samples,
                               "partitions": PARTITIONS}
    unreachable = broker.reachable(settings)
    if unreachable is not None:
        figures["kafka_skipped"] = unreachable
    else:
        with broker.private_topics(settings), tempfile.TemporaryDirectory() as tmp:
            broker.produce(settings, batch)
            ends = broker.end_offsets(settings, sorted({record.topic for record in batch}))
            for n in WORKERS:
                walls = sorted(group_run(settings, ends, n, Path(tmp), f"g{n}-{i}")
                               for i in range(repeat))
                wall = walls[len(walls) // 2]
                figures[f"workers_{n}"] = {"wall_s": round(wall, 2), "runs_s": walls,
                                           "samples_per_s": round(samples / wall)}
        figures["ratio_3_vs_1"] = ratio(figures["workers_3"]["samples_per_s"],
                                        figures["workers_1"]["samples_per_s"])
    options = {"quick": quick, "fleet": msgspec.to_builtins(fleet(quick)),
               "workers": list(WORKERS), "load_average": load_average()}
    path = _write(result_name("scaling", quick), figures, options)
    return {"figures": figures, "settings": options, "path": str(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short run, fewer repetitions")
    args = parser.parse_args()
    result = run(args.quick)
    print(json.dumps(result["figures"], indent=1))
    print(f"results in {result['path']}")


if __name__ == "__main__":
    main()
