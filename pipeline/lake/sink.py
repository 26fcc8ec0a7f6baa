"""`fleetpulse sink lake`: consume the output topics into the Parquet lake, effectively once.

The Kafka side is the edge runner (pipeline/wire/edge.py): offsets are committed only after the
files holding the records are renamed into place (and the dead letters of bad records are
acknowledged by the broker), so a crash at any point replays from the last commit and the
replay overwrites the files it had written (see LakeWriter). On a rebalance the runner flushes
and commits what it holds before giving partitions away.

A write that fails (a full disk, above all) commits nothing: the runner pauses the partitions,
keeps what the writer holds, says why in its log, on /metrics (`fleetpulse_lake_sink_flush_errors
_total{reason="disk_full"}`, `fleetpulse_lake_sink_flush_blocked` 1) and on /readyz, and retries
the same write every few seconds until it succeeds, then resumes where it stopped. A commit the
group refuses (we were away longer than the session) drops what we hold and rewinds to the last
commit, so the replay rewrites the same files. Readers never see a failed file: it is written
under a hidden temporary name that is removed on error.

A record at an offset the lake already holds (below the offsets recorded under lake/_offsets:
the consumer group was reset to an earlier offset) is skipped, not written again
(`fleetpulse_lake_sink_already_in_lake`): the lake holds each record once. To rebuild the lake
from a topic, start from an empty lake (or remove its _offsets entries).
"""

from __future__ import annotations

import errno
import logging
import threading
from dataclasses import dataclass, field
from os import strerror as os_strerror
from pathlib import Path
from typing import Any

from pipeline.config import Settings
from pipeline.errors import DecodeError, SinkError
from pipeline.lake.iceberg_writer import IcebergWriter
from pipeline.lake.tables import TABLES, TableSpec
from pipeline.lake.writer import LakeWriter, Positions, read_committed
from pipeline.selfmetrics import Readiness, serve_stats
from pipeline.wire.batches import is_batch, unpack
from pipeline.wire.codec import JSON, content_type_of, decode, decode_all
from pipeline.wire.edge import EdgeOptions, EdgeStats, run_edge, stop_on_signals
from pipeline.wire.topics import TOPICS, topic_name

log = logging.getLogger(__name__)


@dataclass
class LakeStats:
    rows: int = 0
    files: int = 0
    tombstones: int = 0  # null values on a compacted topic (node-state): skipped, not errors
    # records at offsets the lake already holds (a consumer-group reset): skipped, not written
    already_in_lake: int = 0
    # the Iceberg lake (lake.uri): rows a replay brought that the table's snapshot already held
    # (dropped at commit), and commits another writer got in first (retried)
    iceberg_rows_already_in_lake: int = 0
    iceberg_commit_retries: int = 0
    tables: dict[str, int] = field(default_factory=dict)


class LakeSink:
    """The lake as an EdgeSink: `add` decodes a record into its table, `flush` writes files."""

    def __init__(self, settings: Settings, root: Path | str) -> None:
        self.settings = settings
        # lake.uri set: Iceberg tables, each append holding its offsets (pipeline/lake/iceberg.py)
        self.writer: LakeWriter | IcebergWriter = (
            IcebergWriter(settings.lake) if settings.lake.uri else LakeWriter(root, settings.lake))
        self.stats = LakeStats()
        self.tables: dict[str, TableSpec] = {
            topic_name(settings.kafka, spec.topic_suffix): spec for spec in TABLES.values()
        }
        self._compacted_topics = {
            topic_name(settings.kafka, spec.suffix) for spec in TOPICS if spec.compacted
        }
        self._unmarked: Positions = {}  # committed, not yet recorded under lake/_offsets
        # the next offset per partition that the lake does not hold yet (lake/_offsets)
        self._in_lake: Positions = self._read_in_lake()

    def _read_in_lake(self) -> Positions:
        if isinstance(self.writer, IcebergWriter):
            return self.writer.committed()
        return read_committed(self.writer.root)

    def assigned(self) -> None:
        """Another member may have committed these partitions into the lake since we read it."""
        self._in_lake = self._read_in_lake()

    def add(self, record: Any) -> None:
        spec = self.tables[record.topic]
        if record.offset < self._in_lake.get((record.topic, record.partition), 0):
            # committed into the lake before (the group was reset to an earlier offset): the
            # row is there already; writing it again would be a duplicate
            self.stats.already_in_lake += 1
            return
        if is_batch(record):
            self._add_batch(spec, record)
            return
        limit = self.settings.kafka.max_value_bytes
        try:
            event = decode(record.value, spec.event, limit,
                           content_type_of(getattr(record, "headers", None)))
        except DecodeError as exc:
            if exc.reason == "tombstone" and record.topic in self._compacted_topics:
                self.stats.tombstones += 1  # compaction's delete marker: there is no row
                return
            raise
        self._row(spec, event, record)

    def _add_batch(self, spec: TableSpec, record: Any) -> None:
        """A batch record (pipeline/wire/batches.py: the worker's utilization, the XID
        adapter's and the simulator's events.xid): a row per value, all at the record's offset.
        A value that cannot be decoded makes the record a dead letter naming it; the others are
        rows."""
        pairs = unpack(record.value)
        limit = self.settings.kafka.max_value_bytes
        events = None
        if all(content_type == JSON for content_type, _ in pairs):
            events = decode_all([raw for _, raw in pairs], spec.event, limit)
        if events is None:
            self._one_by_one(spec, record, pairs)
            return
        offsets = [record.offset] * len(events)
        self.writer.extend(spec.name, events, record.topic, record.partition, offsets)
        self.stats.tables[spec.name] = self.stats.tables.get(spec.name, 0) + len(events)

    def _one_by_one(self, spec: TableSpec, record: Any, pairs: list[tuple[str, bytes]]) -> None:
        limit = self.settings.kafka.max_value_bytes
        bad: list[str] = []
        first: DecodeError | None = None
        for index, (content_type, raw) in enumerate(pairs):
            try:
                event = decode(raw, spec.event, limit, content_type)
            except DecodeError as exc:
                bad.append(str(index))
                first = first or exc
                continue
            self._row(spec, event, record)
        if first is not None:
            raise DecodeError(f"value {bad[0]}: {first.field}", first.expected, first.got,
                              f"{len(bad)} bad values: {', '.join(bad[:10])}", first.reason)

    def _row(self, spec: TableSpec, event: Any, record: Any) -> None:
        self.writer.add(spec.name, event, (record.topic, record.partition, record.offset))
        self.stats.tables[spec.name] = self.stats.tables.get(spec.name, 0) + 1

    def flush(self) -> None:
        try:
            self.writer.flush()
        except SinkError as exc:
            raise SinkError(str(exc), reason=write_error_reason(exc)) from exc
        self.stats.rows, self.stats.files = self.writer.rows_written, self.writer.files_written
        if isinstance(self.writer, IcebergWriter):
            self.stats.iceberg_rows_already_in_lake = self.writer.rows_already_in_lake
            self.stats.iceberg_commit_retries = self.writer.commit_conflicts

    def discard(self) -> None:
        self.writer.discard()

    def committed(self, positions: Positions) -> None:
        """Record committed offsets for compaction; on a full disk, again at the next commit
        (the offsets are committed already: only compaction waits for the mark)."""
        pending = {**self._unmarked, **positions}
        try:
            self.writer.mark_committed(pending)
        except OSError as exc:
            self._unmarked = pending
            log.warning("lake: cannot record committed offsets yet (%s); retried next commit", exc)
        else:
            self._unmarked = {}


def write_error_reason(exc: BaseException) -> str:
    """"disk_full", "quota" or "io_error" for a failed write (Arrow's errors may carry the
    errno only in their text)."""
    cause = exc.__cause__ or exc
    code = getattr(cause, "errno", None)
    text = str(cause)
    if code == errno.ENOSPC or "[errno 28]" in text.lower() or os_strerror(errno.ENOSPC) in text:
        return "disk_full"
    if code == errno.EDQUOT or os_strerror(errno.EDQUOT) in text:
        return "quota"
    return "io_error"


def run_lake_sink(
    settings: Settings,
    root: Path | str,
    *,
    stop: threading.Event,
    idle_exit_s: float | None = None,
    stats: EdgeStats | None = None,
    sink: LakeSink | None = None,
    readiness: Readiness | None = None,
) -> EdgeStats:
    """One consumer in the lake sink's group (lake.group_id) until `stop` is set or idle."""
    sink = LakeSink(settings, root) if sink is None else sink
    lake = settings.lake
    options = EdgeOptions(
        max_records=lake.flush_rows,
        max_interval_s=lake.flush_seconds,
        session_timeout_s=lake.session_timeout_s,
        idle_exit_s=idle_exit_s,
    )

    def started(edge: Any) -> None:
        if readiness is not None:
            readiness.check = edge.readiness

    return run_edge(settings, name="lake", topics=sorted(sink.tables), group_id=lake.group_id,
                    sink=sink, stop=stop, options=options, stats=stats, on_start=started)


def run_until_signalled(
    settings: Settings, root: Path | str, idle_exit_s: float | None = None
) -> tuple[EdgeStats, LakeStats]:
    """Run the lake sink with /metrics and /readyz; SIGTERM/SIGINT stop it after a last flush
    and commit."""
    sink, stats, readiness = LakeSink(settings, root), EdgeStats(), Readiness()
    stop = threading.Event()
    serve_stats("lake_sink", stats, settings.metrics, readiness, extra=[sink.stats])
    stop_on_signals(stop)
    run_lake_sink(settings, root, stop=stop, idle_exit_s=idle_exit_s, stats=stats, sink=sink,
                  readiness=readiness)
    return stats, sink.stats
