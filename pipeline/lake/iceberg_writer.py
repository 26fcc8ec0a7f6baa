"""IcebergWriter: LakeWriter's interface over Iceberg tables, each row once with several writers.

Every append records its Kafka offsets in the snapshot summary; a writer drops the rows the
table already holds and retries a commit another writer got in first (pipeline/lake/iceberg.py
says how).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.config import LakeSettings
from pipeline.errors import SinkError
from pipeline.lake.iceberg import (
    COMMIT_ATTEMPTS,
    OFFSETS_KEY,
    Positions,
    _catalog_busy,
    _pause,
    arrow_schema,
    committed_offsets,
    encode_offsets,
    open_catalog,
    table,
)
from pipeline.lake.tables import TABLES
from pipeline.model import Event

log = logging.getLogger(__name__)


@dataclass
class _Chunk:
    """Rows of one topic-partition waiting for the next commit."""

    events: list[Event] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)


class IcebergWriter:
    """LakeWriter's interface (add/extend/flush/discard/mark_committed/checkpoint) over Iceberg
    tables: `flush` commits one append per table, each row once (see the module doc)."""

    def __init__(self, settings: LakeSettings, catalog: Any | None = None) -> None:
        self.settings = settings
        self.catalog = open_catalog(settings) if catalog is None else catalog
        self._tables: dict[str, Any] = {}
        self._pending: dict[tuple[str, str, int], _Chunk] = {}
        self.pending_rows = 0
        self.rows_written = 0
        self.files_written = 0
        self.commits = 0
        self.commit_conflicts = 0  # commits another writer got in first (retried)
        self.rows_already_in_lake = 0  # replayed rows the table held already (dropped)
        for name in TABLES:  # every table exists from the first writer on (other engines see them)
            self.table(name)

    def add(self, name: str, event: Event, source: tuple[str, int, int]) -> None:
        topic, partition, offset = source
        self.extend(name, [event], topic, partition, [offset])

    def extend(self, name: str, events: Sequence[Event], topic: str, partition: int,
               offsets: Sequence[int]) -> None:
        if len(events) != len(offsets):
            raise SinkError(f"lake: {len(events)} events but {len(offsets)} offsets")
        if not events:
            return
        spec = TABLES.get(name)
        if spec is None:
            raise SinkError(f"lake: unknown table {name!r}: expected one of {', '.join(TABLES)}")
        wrong = sorted(t.__name__ for t in set(map(type, events)) if not issubclass(t, spec.event))
        if wrong:
            raise SinkError(f"lake: table {name!r} takes {spec.event.__name__}, "
                            f"got {', '.join(wrong)}")
        if partition < 0 or min(offsets) < 0:
            raise SinkError(f"lake: bad source {(topic, partition, min(offsets))!r}")
        chunk = self._pending.setdefault((name, topic, partition), _Chunk())
        chunk.events.extend(events)
        chunk.offsets.extend(offsets)
        self.pending_rows += len(events)

    def table(self, name: str) -> Any:
        found = self._tables.get(name)
        attempt = 0
        while found is None:
            try:
                found = self._tables[name] = table(self.catalog, self.settings, TABLES[name])
            except _catalog_busy() as exc:  # writers starting together create the same tables
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise SinkError(f"lake: cannot create table {name}: {exc}") from exc
                _pause(attempt, f"creating {name}", exc)
                attempt += 1
        return found

    def committed(self) -> Positions:
        """Every table's committed offsets (a topic feeds one table)."""
        positions: Positions = {}
        for spec in TABLES.values():
            found = table(self.catalog, self.settings, spec, create=False)
            if found is not None:
                positions |= committed_offsets(found)
        return positions

    def flush(self) -> Positions:
        """Commit every table's buffered rows; the next offset per topic-partition flushed.
        Raises SinkError when a table cannot be committed (the buffers are kept)."""
        by_table: dict[str, list[tuple[str, int, _Chunk]]] = {}
        for (name, topic, partition), chunk in sorted(self._pending.items()):
            by_table.setdefault(name, []).append((topic, partition, chunk))
        positions: Positions = {}
        for name, chunks in by_table.items():
            self._commit(name, chunks)
            for topic, partition, chunk in chunks:
                positions[(topic, partition)] = max(chunk.offsets) + 1
                del self._pending[(name, topic, partition)]
                self.pending_rows -= len(chunk.events)
        return positions

    def _commit(self, name: str, chunks: list[tuple[str, int, _Chunk]]) -> None:
        spec = TABLES[name]
        converted = [(topic, partition, np.asarray(chunk.offsets, dtype=np.int64),
                      spec.to_arrow(chunk.events).cast(arrow_schema(spec)))
                     for topic, partition, chunk in chunks]
        found = self.table(name)
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                found.refresh()
            except _catalog_busy() as exc:
                _pause(attempt, f"reading {name}", exc)
                continue
            held = committed_offsets(found)
            parts, dropped = [], 0
            offsets = dict(held)
            for topic, partition, numbers, arrow in converted:
                start = held.get((topic, partition), 0)
                keep = numbers >= start
                dropped += int((~keep).sum())
                if keep.any():
                    parts.append(arrow if keep.all() else arrow.filter(pa.array(keep)))
                    offsets[(topic, partition)] = max(start, int(numbers.max()) + 1)
            if not parts:
                self.rows_already_in_lake += dropped
                return
            rows = pa.concat_tables(parts)
            try:
                found.append(rows, snapshot_properties={OFFSETS_KEY: encode_offsets(offsets)})
            except _catalog_busy() as exc:  # the retry reads the offsets again: never twice
                self.commit_conflicts += 1
                _pause(attempt, f"committing {name}", exc)
                continue
            except OSError as exc:
                raise SinkError(f"lake: cannot write table {name}: {exc}") from exc
            self.rows_already_in_lake += dropped
            self.rows_written += rows.num_rows
            summary = found.current_snapshot().summary
            self.files_written += int(summary.additional_properties.get("added-data-files", 0))
            self.commits += 1
            return
        raise SinkError(f"lake: table {name}: {COMMIT_ATTEMPTS} commits in a row lost to "
                        "other writers")

    def discard(self) -> None:
        self._pending.clear()
        self.pending_rows = 0

    def mark_committed(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Nothing to record: the offsets are in the tables' snapshots already."""

    def checkpoint(self) -> Positions:
        return self.flush()
