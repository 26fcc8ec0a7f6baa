"""What the readers (pipeline/lake/query.py) read from Iceberg: each table's current data files,
copied once into a local cache (lake.cache_path; Iceberg data files never change), and given a
range only utilization's days of it."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.config import LakeSettings
from pipeline.lake import iceberg_rollup
from pipeline.lake.iceberg import (
    _first_line,
    _key,
    day_rows,
    open_catalog,
    rollup_table,
    s3_filesystem,
    table,
)
from pipeline.lake.tables import TABLES, TableSpec

log = logging.getLogger(__name__)


class IcebergSource:
    """What query.Lake reads from Iceberg: each table's current data files, copied once into
    a local cache (lake.cache_path: data files never change once written), where DuckDB scans
    them as it scans the local lake's (a scan through pyarrow's S3 client at every query was
    3-18x slower than the local lake in bench/lake_iceberg.py)."""

    def __init__(self, settings: LakeSettings) -> None:
        self.settings = settings
        self.catalog = open_catalog(settings)
        self.filesystem = s3_filesystem(settings)
        self.cache = cache_dir(settings)
        self.unfetchable: dict[Path, str] = {}  # objects the bucket would not give, and why

    def data_files(self, spec: TableSpec, days: tuple[datetime, datetime] | None = None
                   ) -> list[Any]:
        """The table's current data files; `days`: only those of the day partitions from the
        first's day up to the second (pyiceberg prunes by partition and column bounds)."""
        found = table(self.catalog, self.settings, spec, create=False)
        if found is None:
            return []
        if days is None:
            return [task.file for task in found.scan().plan_files()]
        column, (first, last) = spec.columns[0].name, days
        start = first.replace(hour=0, minute=0, second=0, microsecond=0)
        row_filter = f"{column} >= '{_iso(start)}' AND {column} < '{_iso(last)}'"
        return [task.file for task in found.scan(row_filter=row_filter).plan_files()]

    def local_files(self, spec: TableSpec, days: tuple[datetime, datetime] | None = None
                    ) -> list[Path]:
        """The table's current data files (of `days` only, when given: see data_files) in
        the local cache, fetched if missing."""
        return self.fetch(self.data_files(spec, days))

    def rollup(self) -> tuple[list[Path], dict[str, int]]:
        """The hourly rollup's data files (local copies; none before the first `lake compact`)
        and the utilization rows per day partition now (pipeline/lake/iceberg_rollup.py)."""
        found = rollup_table(self.catalog, self.settings, create=False)
        files = [] if found is None else [task.file for task in found.scan().plan_files()]
        days = day_rows(self.data_files(TABLES[iceberg_rollup.SOURCE_TABLE]))
        return self.fetch(files), days

    def fetch(self, data_files: Sequence[Any]) -> list[Path]:
        """Local copies of `data_files`, fetched into the cache if missing. An object that
        cannot be fetched (gone from the bucket, refused) is left out and named, with why, in
        `unfetchable` (by the path its copy would have)."""
        keys = [_key(f.file_path) for f in data_files]
        wanted = [(key, self.cache / key) for key in keys]
        missing = [(key, path) for key, path in wanted if not path.exists()]
        if missing:
            with ThreadPoolExecutor(max_workers=8, thread_name_prefix="lake-fetch") as pool:
                failed = [f for f in pool.map(lambda pair: self._fetch(*pair), missing) if f]
            self.unfetchable.update(failed)
        return [path for _, path in wanted if path not in self.unfetchable]

    def _fetch(self, key: str, path: Path) -> tuple[Path, str] | None:
        """Copy one object; (its copy's path, why) when the bucket cannot give it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            try:
                with self.filesystem.open_input_stream(key) as source, tmp.open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
            except (OSError, pa.ArrowException) as exc:
                return path, f"cannot fetch s3://{key}: {_first_line(exc)}"
            os.replace(tmp, path)
            return None
        finally:
            tmp.unlink(missing_ok=True)


def _iso(when: datetime) -> str:
    """A naive UTC time (or an aware one) as an Iceberg timestamp literal."""
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when.isoformat(timespec="microseconds")


def cache_dir(settings: LakeSettings) -> Path:
    return Path(settings.cache_path or Path(settings.path) / "_iceberg_cache")


def prune_cache(settings: LakeSettings, keep: set[str], older_than: float) -> int:
    """Remove cached files that no table's current snapshot lists (`keep`: their keys) and
    that were fetched before `older_than` (epoch seconds: a reader may still be scanning
    them); the number removed."""
    root = cache_dir(settings)
    removed = 0
    for path in root.rglob("*.parquet") if root.is_dir() else ():
        key = path.relative_to(root).as_posix()
        if key not in keep and path.stat().st_mtime < older_than:
            path.unlink(missing_ok=True)
            removed += 1
    return removed
