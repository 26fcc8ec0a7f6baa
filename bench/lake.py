"""Lake benchmarks: rows per second into Parquet, and the latency of every canned query over one
day of one-minute rows for 10,000 devices (14.4 M utilization rows).

    python -m bench.lake            # full size; writes bench/results/lake.json
    python -m bench.lake --quick    # 1/10 of the devices, fewer rows: a smoke run

Speeds are medians of several repetitions and are also given as ratios to a baseline measured in
the same run: pyarrow writing the same Arrow table straight to one file (writes), and a DuckDB
scan of one utilization column over the same files (queries).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa

from bench.common import write_result
from pipeline.config import LakeSettings, load_settings
from pipeline.lake.query import Lake, canned_queries
from pipeline.lake.sink import LakeSink
from pipeline.lake.tables import UTILIZATION
from pipeline.lake.writer import LakeWriter, compacted_file_name, partition_dir, write_parquet
from pipeline.model import (
    Action,
    Entity,
    Evidence,
    Finding,
    NodeState,
    RawRecord,
    Reason,
    Target,
    Utilization,
    XidEvent,
)
from pipeline.wire.batches import MAX_ITEMS
from pipeline.wire.batches import headers as batch_headers
from pipeline.wire.codec import JSON, encode
from pipeline.wire.topics import topic_name

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE, HOUR = 60_000, 3_600_000
GPUS_PER_NODE = 8
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200")
SETTINGS = LakeSettings()


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (all threads of this process) of `fn`.

    CPU time is reported next to wall time because the machines these run on are often shared:
    DuckDB spreads a query over every core, so wall time on a busy machine says more about the
    neighbours than about the query.
    """
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


class BatchRecord(NamedTuple):
    """A consumed batch record, as the sink sees it (topic, partition, offset, value, headers)."""

    topic: str
    partition: int
    offset: int
    value: bytes
    headers: list[tuple[str, bytes]]


def packed_values(values: list[bytes]) -> bytes:
    """A batch record's value holding JSON values (pipeline/wire/batches.py)."""
    return msgspec.msgpack.encode([(JSON, value) for value in values])


def utilization_rows(count: int, devices: int) -> list[Utilization]:
    """`count` one-minute rows, device-major within each minute, like the aggregator emits."""
    rng = np.random.default_rng(7)
    utils = rng.uniform(0, 100, count).round(1)
    rows = []
    for i in range(count):
        device = i % devices
        node = device // GPUS_PER_NODE
        rows.append(Utilization(
            window_start=T0 + (i // devices) * MINUTE, window_s=60, cluster="c1",
            pool=f"pool-{node % 10}", zone=f"zone-{node % 5}", node=f"node-{node:05d}",
            device=str(device % GPUS_PER_NODE), accelerator=MODELS[node % 3],
            job=f"job-{node % 300}" if node % 10 < 7 else None, allocated=node % 10 < 7,
            util_mean=float(utils[i]), util_max=min(float(utils[i]) + 5, 100.0),
            mem_used_frac=0.5, power_w_mean=350.0, samples=4))
    return rows


def bench_writes(quick: bool) -> dict[str, Any]:
    count = 200_000 if quick else 1_000_000
    repeat = 3
    rows = utilization_rows(count, devices=10_000)
    table = UTILIZATION.to_arrow(rows)
    scratch = Path(tempfile.mkdtemp(prefix="bench-lake-"))
    # records reach the sink in fetch batches of one partition each: blocks of 1,000 rows
    # round-robin over 6 partitions, the rows of each partition in offset order
    partitions, block = 6, 1000
    part_of = [(i // block) % partitions for i in range(count)]
    by_partition = [[i for i in range(count) if part_of[i] == p] for p in range(partitions)]

    def raw_pyarrow() -> None:
        write_parquet(scratch / "raw.parquet", table, SETTINGS)

    def to_arrow() -> None:
        UTILIZATION.to_arrow(rows)

    def fresh() -> LakeWriter:
        root = scratch / "lake"
        shutil.rmtree(root, ignore_errors=True)
        return LakeWriter(root, SETTINGS)

    def lake_writer() -> None:  # one add per record, as the Kafka sink does
        writer = fresh()
        for offset, row in enumerate(rows):
            writer.add("utilization", row, ("fleet.utilization", part_of[offset], offset))
        writer.flush()

    # the sink's whole path: JSON record bytes (as the worker writes them) decoded, checked and
    # written, as `fleetpulse sink lake` does for each record it consumes
    sink_settings = msgspec.structs.replace(load_settings(environ={}), lake=SETTINGS)
    topic = topic_name(sink_settings.kafka, UTILIZATION.topic_suffix)
    records = [RawRecord(topic=topic, partition=part_of[i], offset=i, value=encode(row))
               for i, row in enumerate(rows)]

    def sink_from_bytes(records: list[Any] = records) -> None:
        root = scratch / "lake"
        shutil.rmtree(root, ignore_errors=True)
        sink = LakeSink(sink_settings, root)
        for record in records:
            sink.add(record)
        sink.flush()

    # ... and from batch records, as the worker writes utilization (kafka.utilization_batch):
    # each partition's fetch block of 1,000 rows in two records of 500 (batches.MAX_ITEMS)
    batch_records = [
        BatchRecord(topic, part_of[i], i, packed_values(
            [encode(row) for row in rows[i : i + MAX_ITEMS]]), batch_headers())
        for i in range(0, count, MAX_ITEMS)
    ]

    def lake_writer_batches() -> None:  # one extend per partition's batch
        writer = fresh()
        for p, offsets in enumerate(by_partition):
            writer.extend("utilization", [rows[i] for i in offsets], "fleet.utilization", p,
                          offsets)
        writer.flush()

    try:
        # interleaved, so a busy neighbour slows each about as much
        raw_s, _ = timed(raw_pyarrow, repeat)
        arrow_s, _ = timed(to_arrow, repeat)
        writer_s, writer_cpu_s = timed(lake_writer, repeat)
        batch_s, _ = timed(lake_writer_batches, repeat)
        sink_s, _ = timed(sink_from_bytes, repeat)
        sink_batches_s, _ = timed(functools.partial(sink_from_bytes, batch_records), repeat)
        raw_again_s, _ = timed(raw_pyarrow, repeat)
        size = sum(p.stat().st_size for p in (scratch / "lake").rglob("*.parquet"))
        choices = compression_choices(table, scratch, repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    raw_s = statistics.median([raw_s, raw_again_s])
    return {
        "rows": count,
        "raw_pyarrow_rows_per_s": round(count / raw_s),
        "to_arrow_rows_per_s": round(count / arrow_s),
        "lake_writer_rows_per_s": round(count / writer_s),
        "lake_writer_vs_raw_pyarrow": round(raw_s / writer_s, 3),
        "lake_writer_batches_rows_per_s": round(count / batch_s),
        "lake_writer_batches_vs_raw_pyarrow": round(raw_s / batch_s, 3),
        "lake_writer_cpu_rows_per_s": round(count / writer_cpu_s),
        "sink_from_bytes_rows_per_s": round(count / sink_s),
        "sink_from_bytes_vs_raw_pyarrow": round(raw_s / sink_s, 3),
        "sink_from_batches_rows_per_s": round(count / sink_batches_s),
        "sink_from_batches_vs_raw_pyarrow": round(raw_s / sink_batches_s, 3),
        "bytes_per_row": round(size / count, 1),
        "compression_choices": choices,
    }


def compression_choices(table: pa.Table, scratch: Path, repeat: int) -> dict[str, Any]:
    """Raw pyarrow rows/s and bytes per row of the same table per codec and row-group size,
    the measurement behind the lake's defaults (LakeSettings)."""
    import pyarrow.parquet as pq

    found: dict[str, Any] = {}
    for codec, level in (("zstd", 1), ("zstd", 3), ("zstd", 6), ("snappy", None), ("lz4", None)):
        for group in (64_000, 128_000, 512_000):
            path = scratch / f"choice-{codec}-{level}-{group}.parquet"
            seconds, _ = timed(functools.partial(
                pq.write_table, table, path, row_group_size=group, compression=codec,
                compression_level=level), repeat)
            found[f"{codec}{level or ''}/{group}"] = {
                "rows_per_s": round(table.num_rows / seconds),
                "bytes_per_row": round(path.stat().st_size / table.num_rows, 2),
            }
    return found


def build_day(root: Path, devices: int) -> int:
    """One day of one-minute utilization rows for `devices` GPUs (as compacted hourly files),
    and events for the other tables in proportion; returns the utilization row count."""
    nodes = devices // GPUS_PER_NODE
    device = np.arange(devices)
    node = device // GPUS_PER_NODE
    rng = np.random.default_rng(11)
    names = pa.array([f"node-{n:05d}" for n in range(nodes)])
    for hour in range(24):
        minutes = np.repeat(np.arange(60), devices)
        ids = np.tile(node, 60)
        util = rng.beta(2, 2, len(minutes)) * 100
        allocated = (ids % 10) < 7
        columns = {
            "window_start": pa.array(T0 + hour * HOUR + minutes * MINUTE, pa.int64()).cast(
                pa.timestamp("ms")),
            "window_s": pa.array(np.full(len(ids), 60), pa.int32()),
            "cluster": pa.array(["c1"] * len(ids)),
            "pool": pa.array(np.char.add("pool-", (ids % 10).astype(str))),
            "zone": pa.array(np.char.add("zone-", (ids % 5).astype(str))),
            "node": names.take(pa.array(ids)),
            "slice": pa.nulls(len(ids), pa.string()),
            "device": pa.array(np.tile(device % GPUS_PER_NODE, 60).astype(str)),
            "accelerator": pa.array(np.array(MODELS)[ids % 3]),
            "job": pa.array(np.where(allocated, np.char.add("job-", (ids % 300).astype(str)).astype(object),
                                     np.array(None, dtype=object))),
            "allocated": pa.array(allocated),
            "util_mean": pa.array(util.round(1)),
            "util_max": pa.array(np.minimum(util + 5, 100).round(1)),
            "mem_used_frac": pa.array(rng.uniform(0, 1, len(ids))),
            "power_w_mean": pa.array(rng.uniform(80, 700, len(ids))),
            "samples": pa.array(np.full(len(ids), 4), pa.int32()),
            "schema": pa.array(["utilization/1"] * len(ids)),
        }
        # columns the model added since (step_compute_s, …): NULL, as a source without them
        columns |= {f.name: pa.nulls(len(ids), f.type) for f in UTILIZATION.schema
                    if f.name not in columns}
        table = pa.table(columns, schema=UTILIZATION.schema)
        directory = partition_dir(root, "utilization", (T0 + hour * HOUR) // HOUR)
        directory.mkdir(parents=True, exist_ok=True)
        first = hour * len(ids)
        name = compacted_file_name("fleet.utilization", 0, first, first + len(ids) - 1)
        write_parquet(directory / name, table, SETTINGS)
    _events(root, nodes)
    return 24 * 60 * devices


def _events(root: Path, nodes: int) -> None:
    rng = np.random.default_rng(5)
    writer = LakeWriter(root, SETTINGS)
    states = ("healthy", "suspect", "degraded", "cordoned", "repairing", "probation")
    for i in range(nodes * 4):  # findings, node-state changes, XIDs: a few per node per day
        n = int(rng.integers(nodes))
        at = T0 + int(rng.integers(24 * HOUR))
        target = Target(cluster="c1", kind="node", name=f"node-{n:05d}", pool=f"pool-{n % 10}",
                        zone=f"zone-{n % 5}")
        writer.add("findings", Finding(
            finding_id=f"finding-{i:08d}", ts=at, entity=Entity(kind="gpu", target=target,
                                                                device="0"),
            check="xid", severity="warning", healthy=False, recommended_action="watch",
            evidence=Evidence(metric="xid", value=79.0, baseline=None, score=None, window_s=60),
        ), ("fleet.findings", 0, i))
        writer.add("node_state", NodeState(
            ts=at, target=target, state=states[i % len(states)],  # type: ignore[arg-type]
            since=at, episode=f"episode-{n:05d}-{i % 3}"), ("fleet.node-state", 0, i))
        writer.add("xid", XidEvent(
            ts=at, cluster="c1", node=target.name, pool=target.pool, zone=target.zone,
            pci_bus_id="0000:53:00", xid=int(rng.choice([13, 31, 48, 79, 94])),
            message="NVRM: Xid", source="simulator"), ("fleet.events.xid", 0, i))
        if i % 10 == 0:
            writer.add("actions", Action(
                action_id=f"action-{i:08d}", ts=at, kind="cordon", target=target,
                reason=Reason(checks=["xid"], finding_ids=[f"finding-{i:08d}"], summary="xid"),
                dry_run=False, proposal_id=f"proposal-{i:08d}"), ("fleet.actions", 0, i))
    writer.checkpoint()


def bench_queries(quick: bool) -> dict[str, Any]:
    devices = 1_000 if quick else 10_000
    repeat = 3
    scratch = Path(tempfile.mkdtemp(prefix="bench-lake-q-"))
    try:
        started = time.perf_counter()
        rows = build_day(scratch, devices)
        built_s = time.perf_counter() - started
        open_s, _ = timed(lambda: Lake(scratch).close(), repeat)
        with Lake(scratch) as lake:
            since = datetime(2026, 1, 1)
            params = {"since": since, "until": since + timedelta(days=1)}
            scan_s, _ = timed(lambda: lake.sql("SELECT sum(util_mean) FROM utilization"), repeat)
            latencies, cpu = {}, {}
            for name, query in canned_queries().items():
                given = {k: v for k, v in params.items() if k in query.params}
                lake.run(name, **given)  # warm: file metadata cached like a repeat user's
                seconds, cpu_s = timed(functools.partial(lake.run, name, **given), repeat)
                latencies[name], cpu[name] = round(seconds, 4), round(cpu_s, 4)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "devices": devices,
        "utilization_rows": rows,
        "build_s": round(built_s, 1),
        "lake_open_s": round(open_s, 4),
        "baseline_scan_s": round(scan_s, 4),
        "query_s": latencies,
        "query_cpu_s": cpu,
        "threads": os.cpu_count(),
        "query_vs_scan": {n: round(s / scan_s, 2) for n, s in latencies.items()},
        "slowest": max(latencies, key=lambda n: latencies[n]),
        "under_1s": sum(s < 1.0 for s in latencies.values()),
        # what the wall time would be with every core to itself: CPU seconds over cores
        "under_1s_on_idle_cores": sum(c / (os.cpu_count() or 1) < 1.0 for c in cpu.values()),
        "queries": len(latencies),
    }


def run(quick: bool) -> dict[str, Any]:
    figures = {"writes": bench_writes(quick), "queries": bench_queries(quick)}
    settings = {"quick": quick, "row_group_rows": SETTINGS.row_group_rows,
                "compression": f"zstd level {SETTINGS.compression_level}",
                "load_average": os.getloadavg()}
    path = write_result("lake" + ("-quick" if quick else ""), figures, settings)
    return {"figures": figures, "settings": settings, "path": str(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    result = run(parser.parse_args().quick)
    writes, queries = result["figures"]["writes"], result["figures"]["queries"]
    print(f"writes: {writes['lake_writer_rows_per_s']:,} rows/s through LakeWriter.add "
          f"({writes['lake_writer_vs_raw_pyarrow']}x raw pyarrow at "
          f"{writes['raw_pyarrow_rows_per_s']:,} rows/s), "
          f"{writes['lake_writer_batches_rows_per_s']:,} rows/s through LakeWriter.extend "
          f"({writes['lake_writer_batches_vs_raw_pyarrow']}x), {writes['bytes_per_row']} B/row")
    print(f"queries over {queries['utilization_rows']:,} utilization rows "
          f"({queries['devices']:,} devices x 1 day): lake open {queries['lake_open_s']} s, "
          f"one-column scan {queries['baseline_scan_s']} s")
    for name, seconds in sorted(queries["query_s"].items(), key=lambda item: -item[1]):
        print(f"  {name:28} {seconds:8.3f} s wall {queries['query_cpu_s'][name]:8.3f} s cpu  "
              f"({queries['query_vs_scan'][name]}x scan)")
    print(f"{queries['under_1s']}/{queries['queries']} under 1 s wall, "
          f"{queries['under_1s_on_idle_cores']} under 1 s of CPU per core; load average "
          f"{result['settings']['load_average']}; results in {result['path']}")


if __name__ == "__main__":
    main()
