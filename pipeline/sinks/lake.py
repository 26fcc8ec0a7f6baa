"""The lake writer: events → Parquet (zstd) under `<root>/<table>/date=YYYY-MM-DD/hour=HH/`.

Used by the Kafka sink (`fleetpulse sink lake`) and by the embedded runtime alike:

    writer = LakeWriter(root, settings.lake)
    writer.add("findings", finding, source=("fleet.findings", 3, 1042))
    positions = writer.flush()          # files renamed into place
    consumer.commit(positions)          # only now is the input acknowledged
    writer.mark_committed(positions)    # lets compaction touch those files

Why replays never duplicate: a flush writes one file per (table, hour, topic, partition), named
`<topic>-<partition>-<first offset>.parquet`, to a temporary name that is renamed into place.
Every batch starts at the committed offset, so after a crash the replayed batch holding that
hour's first uncommitted record writes the same name and replaces the file rather than adding
to it; rows beyond where the replayed batch ends go to files that start at a later offset.

Compacted files (pipeline/sinks/lake_compact.py) are named `<topic>-<partition>-<first>-to-
<last>.parquet`; `visible_files` hides every file whose offsets such a file already holds, so a
reader never counts a row twice while compaction swaps files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import LakeSettings
from pipeline.errors import SinkError
from pipeline.model import Event
from pipeline.sinks.lake_tables import TABLES, TableSpec

Source = tuple[str, int, int]  # (topic, partition, offset)
Positions = dict[tuple[str, int], int]  # (topic, partition) -> next offset to consume

HOUR_MS = 3_600_000
OFFSETS_DIR = "_offsets"
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_FILE = re.compile(
    r"^(?P<topic>.+)-(?P<partition>\d+)-(?P<first>\d+)(?:-to-(?P<last>\d+))?\.parquet$"
)
_DATE_DIR = re.compile(r"^date=\d{4}-\d{2}-\d{2}$")
_HOUR_DIR = re.compile(r"^hour=\d{2}$")


@dataclass(frozen=True, order=True)
class LakeFile:
    """A Parquet file in a partition directory, with the offsets its name promises."""

    topic: str
    partition: int
    first: int
    last: int  # == first for a sink file (its true last offset is in its metadata)
    path: Path = field(compare=False)

    @property
    def compacted(self) -> bool:
        return self.path.name.endswith(f"-to-{self.last}.parquet")


def parse_file(path: Path) -> LakeFile | None:
    match = _FILE.match(path.name)
    if match is None:
        return None
    first = int(match["first"])
    last = int(match["last"]) if match["last"] is not None else first
    return LakeFile(match["topic"], int(match["partition"]), first, last, path)


def sink_file_name(topic: str, partition: int, first: int) -> str:
    return f"{topic}-{partition}-{first}.parquet"


def compacted_file_name(topic: str, partition: int, first: int, last: int) -> str:
    return f"{topic}-{partition}-{first}-to-{last}.parquet"


def partition_dir(root: Path, table: str, hour_bucket: int) -> Path:
    when = datetime.fromtimestamp(hour_bucket * 3600, tz=UTC)
    return root / table / f"date={when:%Y-%m-%d}" / f"hour={when:%H}"


def partition_dirs(root: Path, table: str) -> Iterator[Path]:
    """Every `date=…/hour=…` directory of a table, oldest first."""
    base = root / table
    if not base.is_dir():
        return
    for day in sorted(p for p in base.iterdir() if _DATE_DIR.match(p.name) and p.is_dir()):
        yield from sorted(p for p in day.iterdir() if _HOUR_DIR.match(p.name) and p.is_dir())


def files_in(directory: Path) -> list[LakeFile]:
    """The finished Parquet files of one partition directory that no compacted file supersedes."""
    found = scan_dir(directory)
    ranges = [f for f in found if f.compacted]
    return sorted(f for f in found if not any(supersedes(r, f) for r in ranges))


def superseded_in(directory: Path) -> list[tuple[LakeFile, LakeFile]]:
    """(file, the compacted file that holds its rows) for files readers no longer read."""
    found = scan_dir(directory)
    ranges = [f for f in found if f.compacted]
    return sorted((f, r) for f in found for r in ranges if supersedes(r, f))


def scan_dir(directory: Path) -> list[LakeFile]:
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            parsed = parse_file(Path(entry.path))
            if parsed is not None:
                found.append(parsed)
    return found


def supersedes(compacted: LakeFile, other: LakeFile) -> bool:
    return (
        compacted.path.name != other.path.name
        and (compacted.topic, compacted.partition) == (other.topic, other.partition)
        and compacted.first <= other.first
        and other.last <= compacted.last
    )


def visible_files(root: Path, table: str) -> list[Path]:
    """The files a reader should read for `table`: each row exactly once."""
    return [f.path for directory in partition_dirs(root, table) for f in files_in(directory)]


def read_committed(root: Path) -> Positions:
    """The offsets the sink has committed, as recorded by `mark_committed`."""
    positions: Positions = {}
    directory = root / OFFSETS_DIR
    if not directory.is_dir():
        return positions
    for path in directory.glob("*.json"):
        data = json.loads(path.read_text())
        positions[(data["topic"], int(data["partition"]))] = int(data["next_offset"])
    return positions


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Write through `write(tmp)` to a hidden temporary name, fsync, rename into place."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync(path.parent)  # the rename itself must survive a power cut before we commit


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Buffer:
    first: int
    last: int
    events: list[Event]


class LakeWriter:
    """Buffers events per (table, hour, topic, partition) and writes them out on `flush`."""

    def __init__(self, root: Path | str, settings: LakeSettings) -> None:
        self.root = Path(root)
        self.settings = settings
        self._buffers: dict[tuple[str, int, str, int], _Buffer] = {}
        self._positions: Positions = {}
        self.pending_rows = 0
        self.rows_written = 0
        self.files_written = 0

    def add(self, table: str, event: Event, source: Source) -> None:
        """Buffer one event; `source` is (topic, partition, offset) of the record it came from."""
        spec = _spec(table, event)
        topic, partition, offset = source
        position = (topic, partition)
        seen = self._positions.get(position)
        if offset < 0 or (seen is None and (partition < 0 or not _TOPIC.match(topic))):
            raise SinkError(
                f"lake: bad source {source!r}: expected (topic, partition >= 0, offset >= 0)"
            )
        key = (table, spec.time(event) // HOUR_MS, topic, partition)
        buffer = self._buffers.get(key)
        if buffer is None:
            self._buffers[key] = _Buffer(offset, offset, [event])
        else:
            buffer.events.append(event)
            # offsets rise within a partition; min/max keep a file's range right if they don't
            if offset > buffer.last:
                buffer.last = offset
            elif offset < buffer.first:
                buffer.first = offset
        if seen is None or offset >= seen:
            self._positions[position] = offset + 1
        self.pending_rows += 1

    def flush(self) -> Positions:
        """Write every buffer to its file; return the next offset per (topic, partition) written.

        Raises SinkError if a file could not be written; then nothing may be committed, and the
        buffers are kept so the caller may retry or crash and replay.
        """
        for key in sorted(self._buffers):
            self._write(key, self._buffers[key])
            del self._buffers[key]
        positions, self._positions = self._positions, {}
        self.pending_rows = 0
        return positions

    def discard(self) -> None:
        """Forget every buffered event (their input was not acknowledged: it is replayed)."""
        self._buffers.clear()
        self._positions = {}
        self.pending_rows = 0

    def mark_committed(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Record offsets the input has committed; compaction merges only files below them."""
        directory = self.root / OFFSETS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        for (topic, partition), offset in sorted(positions.items()):
            body = json.dumps({"topic": topic, "partition": partition, "next_offset": offset})
            write_atomically(directory / f"{topic}-{partition}.json", _text_writer(body))

    def checkpoint(self) -> Positions:
        """Flush and mark at once, for inputs that need no acknowledgement (embedded runtime)."""
        positions = self.flush()
        self.mark_committed(positions)
        return positions

    def _write(self, key: tuple[str, int, str, int], buffer: _Buffer) -> None:
        table, hour_bucket, topic, partition = key
        spec = TABLES[table]
        directory = partition_dir(self.root, table, hour_bucket)
        path = directory / sink_file_name(topic, partition, buffer.first)
        arrow = spec.to_arrow(buffer.events)
        metadata = {
            **(spec.schema.metadata or {}),
            b"fleetpulse.topic": topic.encode(),
            b"fleetpulse.partition": str(partition).encode(),
            b"fleetpulse.first_offset": str(buffer.first).encode(),
            b"fleetpulse.last_offset": str(buffer.last).encode(),
        }
        try:
            directory.mkdir(parents=True, exist_ok=True)
            arrow = arrow.replace_schema_metadata(metadata)
            write_atomically(path, lambda tmp: write_parquet(tmp, arrow, self.settings))
        except OSError as exc:
            raise SinkError(f"lake: cannot write {path}: {exc}") from exc
        self.rows_written += arrow.num_rows
        self.files_written += 1


def write_parquet(path: Path, arrow: pa.Table, settings: LakeSettings) -> None:
    pq.write_table(
        arrow,
        path,
        row_group_size=settings.row_group_rows,
        compression="zstd",
        compression_level=settings.compression_level,
    )


def _text_writer(body: str) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        tmp.write_text(body)

    return write


def _spec(table: str, event: Event) -> TableSpec:
    spec = TABLES.get(table)
    if spec is None:
        raise SinkError(f"lake: unknown table {table!r}: expected one of {', '.join(TABLES)}")
    if not isinstance(event, spec.event):
        got = type(event).__name__
        raise SinkError(f"lake: table {table!r} takes {spec.event.__name__}, got {got}")
    return spec
