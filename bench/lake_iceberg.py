"""The Iceberg lake on s3proxy against the local Parquet lake, in the same run (issue 40).

    python -m bench --only lake-iceberg            # 1M rows written; a day of 10,000 GPUs
    python -m bench --only lake-iceberg --quick    # 200k rows; a day of 1,000 GPUs

Writes: the same utilization rows through LakeWriter (local Parquet, one flush) and through
IcebergWriter (one commit, data on s3proxy): rows/s of each and their ratio. Queries: a day of
one-minute utilization for the GPUs (and the other tables in proportion: bench/lake.py's
`build_day`), the same files appended to Iceberg tables; every canned query on both, median of
3 after a warm run, and each Iceberg latency over the local one; readers copy the data files
into a local cache once (lake.cache_path), so the first open's time is given apart. Needs the s3proxy that
`make bench` starts (deploy/with-services.sh: S3_PORT, S3_ACCESS_KEY, S3_SECRET_KEY); without
one it reports "skipped". Not a test: nothing passes or fails on a speed.
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from bench.common import write_result
from bench.lake import SETTINGS, build_day, timed, utilization_rows
from pipeline.config import LakeSettings
from pipeline.lake.iceberg import arrow_schema, create_bucket
from pipeline.lake.iceberg_writer import IcebergWriter
from pipeline.lake.query import Lake, canned_queries
from pipeline.lake.tables import TABLES
from pipeline.lake.writer import LakeWriter, visible_files


def _settings(folder: Path) -> LakeSettings:
    port = os.environ.get("S3_PORT", "19645")
    return LakeSettings(
        path=str(folder), uri=f"s3://fleetpulse-bench/{uuid.uuid4().hex[:12]}",
        catalog=f"sqlite:///{folder / 'catalog.db'}", s3_endpoint=f"http://127.0.0.1:{port}",
        s3_access_key_id=os.environ.get("S3_ACCESS_KEY", "fleetpulse"),
        s3_secret_access_key=os.environ.get("S3_SECRET_KEY", "fleetpulse-secret"))


def bench_writes(quick: bool, scratch: Path) -> dict[str, Any]:
    """The same rows of 6 partitions, one flush: local Parquet, then Iceberg (each run a
    fresh catalog and prefix; opening the writer, which creates the tables, is not timed)."""
    count = 200_000 if quick else 1_000_000
    rows = utilization_rows(count, devices=10_000)
    parts = [rows[p::6] for p in range(6)]

    def fill(writer: LakeWriter | IcebergWriter) -> None:
        for p, part in enumerate(parts):
            writer.extend("utilization", part, "fleet.utilization", p, list(range(len(part))))
        writer.flush()

    def local() -> None:
        root = scratch / "write-local"
        shutil.rmtree(root, ignore_errors=True)
        fill(LakeWriter(root, SETTINGS))

    local_s, _ = timed(local, 3)
    runs, opens = [], []
    for _ in range(3):
        folder = scratch / f"write-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        started = time.perf_counter()
        writer = IcebergWriter(_settings(folder))
        opens.append(time.perf_counter() - started)
        started = time.perf_counter()
        fill(writer)
        runs.append(time.perf_counter() - started)
    iceberg_s = statistics.median(runs)
    return {
        "rows": count,
        "local_rows_per_s": round(count / local_s),
        "iceberg_rows_per_s": round(count / iceberg_s),
        "iceberg_vs_local": round(local_s / iceberg_s, 3),
        "iceberg_writer_open_s": round(statistics.median(opens), 3),
    }


def _to_iceberg(local: Path, settings: LakeSettings) -> None:
    """The local lake's files appended to the Iceberg tables, one commit per file."""
    writer = IcebergWriter(settings)
    for name, spec in TABLES.items():
        table = writer.table(name)
        for path in visible_files(local, name):
            rows = ds.dataset(str(path), format="parquet").to_table()
            table.append(rows.select(spec.schema.names).cast(arrow_schema(spec)))


def bench_queries(quick: bool, scratch: Path) -> dict[str, Any]:
    devices = 1_000 if quick else 10_000
    local = scratch / "day"
    started = time.perf_counter()
    rows = build_day(local, devices)
    built_s = time.perf_counter() - started
    (scratch / "iceberg-day").mkdir()
    settings = _settings(scratch / "iceberg-day")
    started = time.perf_counter()
    _to_iceberg(local, settings)
    appended_s = time.perf_counter() - started
    since = datetime(2026, 1, 1)
    params = {"since": since, "until": since + timedelta(days=1)}
    latencies: dict[str, dict[str, float]] = {"local": {}, "iceberg": {}}
    opened: dict[str, float] = {}
    started = time.perf_counter()
    Lake(local, settings).close()  # the first open fetches every data file into the cache
    cold_open_s = time.perf_counter() - started
    for backend, lake_settings in (("local", SETTINGS), ("iceberg", settings)):
        opened[backend], _ = timed(functools.partial(_open_close, local, lake_settings), 3)
        with Lake(local, lake_settings) as lake:
            for name, query in canned_queries().items():
                if query.alias_of:
                    continue
                given = {k: v for k, v in params.items() if k in query.params}
                lake.run(name, **given)  # warm
                seconds, _ = timed(functools.partial(lake.run, name, **given), 3)
                latencies[backend][name] = round(seconds, 4)
    iceberg = latencies["iceberg"]
    return {
        "devices": devices,
        "utilization_rows": rows,
        "build_s": round(built_s, 1),
        "append_to_iceberg_s": round(appended_s, 1),
        "open_s": {k: round(v, 3) for k, v in opened.items()},
        "iceberg_first_open_s": round(cold_open_s, 2),  # fetching the files into the cache
        "query_s": latencies,
        "iceberg_vs_local": {n: round(s / max(latencies["local"][n], 1e-6), 2)
                             for n, s in iceberg.items()},
        "iceberg_slowest": max(iceberg, key=lambda n: iceberg[n]),
        "iceberg_slowest_s": max(iceberg.values()),
        "iceberg_under_2s": sum(s < 2.0 for s in iceberg.values()),
        "queries": len(iceberg),
    }


def _open_close(root: Path, settings: LakeSettings) -> None:
    Lake(root, settings).close()


def run(quick: bool) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="bench-iceberg-"))
    try:
        (scratch / "probe").mkdir()
        create_bucket(_settings(scratch / "probe"))
    except OSError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        return {"skipped": f"no S3 store on S3_PORT ({exc}); run through make bench"}
    try:
        figures = {"writes": bench_writes(quick, scratch), "queries": bench_queries(quick, scratch)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    settings = {"quick": quick, "store": "s3proxy 3.0.0 (filesystem backend) on 127.0.0.1",
                "catalog": "SQLite", "load_average": os.getloadavg()}
    path = write_result("lake-iceberg" + ("-quick" if quick else ""), figures, settings)
    return {"figures": figures, "settings": settings, "path": str(path)}
