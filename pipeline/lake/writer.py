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

Compacted files (pipeline/lake/compact.py) are named `<topic>-<partition>-<first>-to-
<last>.parquet`; `visible_files` hides every file whose offsets such a file already holds, so a
reader never counts a row twice while compaction swaps files.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import LakeSettings
from pipeline.errors import SinkError
from pipeline.lake.tables import TABLES, TableSpec
from pipeline.model import Event

Source = tuple[str, int, int]  # (topic, partition, offset)
_Key = tuple[str, int, str, int]  # (table, hour bucket, topic, partition): one file per flush
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
class _Pending:
    """Rows of one (table, topic, partition) since the last flush: the events and their
    offsets, in arrival order. Nothing per row but two list appends: the hour split and the
    Arrow columns are built for the whole batch at flush."""

    events: list[Event] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    kind: type[Event] | None = None  # the table's event type (anything else is checked)
    next: int = 0  # one past the highest offset buffered: folded into the positions at flush


@dataclass
class _Ready:
    """One file's rows, converted and waiting to be written (kept when a write fails)."""

    arrow: pa.Table
    first: int
    last: int


class LakeWriter:
    """Buffers events per (table, topic, partition) and writes them out on `flush`, one file
    per (table, hour, topic, partition)."""

    def __init__(self, root: Path | str, settings: LakeSettings) -> None:
        self.root = Path(root)
        self.settings = settings
        self._pending: dict[tuple[str, str, int], _Pending] = {}
        self._ready: dict[_Key, _Ready] = {}
        self._positions: Positions = {}
        self.pending_rows = 0
        self.rows_written = 0
        self.files_written = 0

    def add(self, table: str, event: Event, source: Source) -> None:
        """Buffer one event; `source` is (topic, partition, offset) of the record it came from."""
        topic, partition, offset = source
        pending = self._pending.get((table, topic, partition))
        if pending is None or type(event) is not pending.kind or offset < 0:
            pending = self._start(table, [event], topic, partition, [offset])
        pending.events.append(event)
        pending.offsets.append(offset)
        if offset >= pending.next:
            pending.next = offset + 1
        self.pending_rows += 1

    def extend(
        self, table: str, events: Sequence[Event], topic: str, partition: int,
        offsets: Sequence[int],
    ) -> None:
        """Buffer a batch of events of one partition, `offsets[i]` the offset of `events[i]`."""
        if len(events) != len(offsets):
            raise SinkError(f"lake: {len(events)} events but {len(offsets)} offsets")
        if not events:
            return
        pending = self._start(table, events, topic, partition, offsets)
        pending.events.extend(events)
        pending.offsets.extend(offsets)
        pending.next = max(pending.next, max(offsets) + 1)
        self.pending_rows += len(events)

    def _start(
        self, table: str, events: Sequence[Event], topic: str, partition: int,
        offsets: Sequence[int],
    ) -> _Pending:
        """Check what `add`/`extend` take before buffering it: the table, the event types,
        the source (checked once per partition: it becomes a file name)."""
        spec = _spec(table, events)
        if min(offsets) < 0 or (
            (topic, partition) not in self._positions
            and (partition < 0 or not _TOPIC.match(topic))
        ):
            raise SinkError(
                f"lake: bad source {(topic, partition, min(offsets))!r}: expected "
                "(topic, partition >= 0, offset >= 0)"
            )
        self._positions.setdefault((topic, partition), 0)
        return self._pending.setdefault((spec.name, topic, partition), _Pending(kind=spec.event))

    def flush(self) -> Positions:
        """Write every buffer to its file; return the next offset per (topic, partition) written.

        Raises SinkError if a file could not be written; then nothing may be committed, and the
        buffers are kept so the caller may retry or crash and replay.
        """
        # One thread writes (Parquet encoding, compression and fsync run without the GIL) while
        # this one converts the next batch to Arrow: a flush costs about its conversion, not
        # conversion plus writing. Files are written in the order they are queued, and after a
        # failure the rest are left queued, as if written one after the other.
        for (_, topic, partition), pending in self._pending.items():
            position = (topic, partition)
            self._positions[position] = max(self._positions.get(position, 0), pending.next)
        stop = threading.Event()
        writes: list[tuple[_Key, Future[bool]]] = []
        submitted: set[_Key] = set()
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lake-write") as pool:
                try:
                    queued = self._convert()  # this flush's files, as each is converted
                    left = sorted(self._ready)  # files a failed flush left: written last
                    for key in itertools.chain(queued, left):
                        if key not in submitted:  # a left file that new rows joined: queued
                            submitted.add(key)
                            ready = self._ready[key]
                            writes.append((key, pool.submit(self._write_unless, stop, key, ready)))
                except BaseException:
                    stop.set()
                    raise
        finally:
            for key, future in writes:
                if future.exception() is None and future.result():
                    del self._ready[key]
        failed = next((f.exception() for _, f in writes if f.exception() is not None), None)
        if failed is not None:
            raise failed
        positions = {key: offset for key, offset in self._positions.items() if offset > 0}
        self._positions = {}
        self.pending_rows = 0
        return positions

    def _write_unless(self, stop: threading.Event, key: _Key, ready: _Ready) -> bool:
        """Write one queued file (in the writing thread) unless an earlier write failed."""
        if stop.is_set():
            return False
        try:
            self._write(key, ready)
        except BaseException:
            stop.set()
            raise
        return True

    def discard(self) -> None:
        """Forget every buffered event (their input was not acknowledged: it is replayed)."""
        self._pending.clear()
        self._ready.clear()
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

    def _convert(self) -> Iterator[_Key]:
        """Pending events → Arrow columns, a whole partition's batch at once, split by event
        hour (the table's first column) with numpy; rows keep their arrival order. Yields the
        key of each file it queues, as soon as it is queued."""
        for source in sorted(self._pending):
            table, topic, partition = source
            pending = self._pending[source]
            arrow = TABLES[table].to_arrow(pending.events)
            del self._pending[source]  # converted: its rows are in `arrow` now
            offsets = np.asarray(pending.offsets, dtype=np.int64)
            # the first column is the event time (TIMESTAMP ms): its int64 view, hour buckets
            hours = arrow.column(0).to_numpy().view(np.int64) // HOUR_MS
            for hour in np.unique(hours).tolist():
                rows = np.flatnonzero(hours == hour)
                got = offsets[rows]
                key = (table, hour, topic, partition)
                self._queue(key, _rows(arrow, rows), int(got.min()), int(got.max()))
                yield key

    def _queue(self, key: _Key, arrow: pa.Table, first: int, last: int) -> None:
        ready = self._ready.get(key)
        if ready is None:
            self._ready[key] = _Ready(arrow, first, last)
        else:  # rows added after a failed flush go to the same file as those before it
            merged = pa.concat_tables([ready.arrow, arrow])
            self._ready[key] = _Ready(merged, min(first, ready.first), max(last, ready.last))

    def _write(self, key: _Key, ready: _Ready) -> None:
        table, hour_bucket, topic, partition = key
        spec = TABLES[table]
        directory = partition_dir(self.root, table, hour_bucket)
        path = directory / sink_file_name(topic, partition, ready.first)
        metadata = {
            **(spec.schema.metadata or {}),
            b"fleetpulse.topic": topic.encode(),
            b"fleetpulse.partition": str(partition).encode(),
            b"fleetpulse.first_offset": str(ready.first).encode(),
            b"fleetpulse.last_offset": str(ready.last).encode(),
        }
        try:
            directory.mkdir(parents=True, exist_ok=True)
            arrow = ready.arrow.replace_schema_metadata(metadata)
            write_atomically(path, lambda tmp: write_parquet(tmp, arrow, self.settings))
        except OSError as exc:
            raise SinkError(f"lake: cannot write {path}: {exc}") from exc
        self.rows_written += arrow.num_rows
        self.files_written += 1


def _rows(arrow: pa.Table, rows: np.ndarray) -> pa.Table:
    """The given rows (ascending indices) of a table: itself, a zero-copy slice when they are
    one run (a partition's events mostly arrive in time order), or a copy."""
    if len(rows) == arrow.num_rows:
        return arrow
    if rows[-1] - rows[0] + 1 == len(rows):
        return arrow.slice(int(rows[0]), len(rows))
    return arrow.take(rows)


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


def _spec(table: str, events: Sequence[Event]) -> TableSpec:
    spec = TABLES.get(table)
    if spec is None:
        raise SinkError(f"lake: unknown table {table!r}: expected one of {', '.join(TABLES)}")
    # the distinct types of a batch (a C loop over it), not an isinstance call per event
    wrong = sorted(t.__name__ for t in set(map(type, events)) if not issubclass(t, spec.event))
    if wrong:
        got = ", ".join(wrong)
        raise SinkError(f"lake: table {table!r} takes {spec.event.__name__}, got {got}")
    return spec
