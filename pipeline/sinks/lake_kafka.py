"""`fleetpulse sink lake`: consume the output topics into the Parquet lake, effectively once.

Offsets are committed only after the files holding the records are renamed into place (and the
dead letters of bad records are acknowledged by the broker), so a crash at any point replays
from the last commit and the replay overwrites the files it had written (see LakeWriter). On a
rebalance the sink flushes and commits what it holds before giving partitions away.

A write that fails (a full disk, above all) commits nothing: the sink pauses its partitions,
keeps what it holds, says why in its log, on /metrics (`fleetpulse_lake_sink_write_errors_total
{reason="disk_full"}`, `fleetpulse_lake_sink_writes_blocked` 1) and on /readyz, and retries the
same write every few seconds until it succeeds, then resumes where it stopped. A commit the
broker cannot take (it is away) is retried the same way; a commit the group refuses (we were
away longer than the session, the partitions may have moved) drops what we hold and rewinds to
the last commit, so the replay rewrites the same files. Readers never see
a failed file: it is written under a hidden temporary name that is removed on error.
"""

from __future__ import annotations

import errno
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from os import strerror as os_strerror
from pathlib import Path
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer
from kafka.errors import CommitFailedError, KafkaError
from kafka.structs import OffsetAndMetadata, TopicPartition

from pipeline.codec import decode, encode
from pipeline.config import Settings
from pipeline.deadletter import dead_letter
from pipeline.errors import DecodeError, SinkError
from pipeline.kafka_client import check_login, client_kwargs
from pipeline.runtime.topics import TOPICS, topic_name
from pipeline.selfmetrics import consumer_readiness, serve_stats
from pipeline.sinks.lake import LakeWriter, Positions
from pipeline.sinks.lake_tables import TABLES, TableSpec

log = logging.getLogger(__name__)

RETRY_WRITE_S = 2.0  # how often a sink whose writes fail tries the same write again
# a commit waits this long for the broker, then the sink pauses and retries (it would block
# the loop for the client's default minute otherwise)
COMMIT_TIMEOUT_MS = 5000
# kafka-python backs off reconnecting up to 30 s by default: after a broker restart the sink
# would sit that long with the broker back; try at least every 2 s
RECONNECT_BACKOFF_MAX_MS = 2000


@dataclass
class SinkStats:
    records: int = 0
    rows: int = 0
    dead_letters: int = 0
    tombstones: int = 0  # null values on a compacted topic (node-state): skipped, not errors
    commits: int = 0
    files: int = 0
    tables: dict[str, int] = field(default_factory=dict)
    # failed lake writes by reason ("disk_full", "quota", "io_error"); nothing was committed
    write_errors: dict[str, int] = field(default_factory=dict, metadata={"label": "reason"})
    writes_blocked: int = field(default=0, metadata={"gauge": True})  # 1 while writes fail
    # offset commits refused: "broker_unavailable" (retried), "rebalanced" (replayed)
    commit_errors: dict[str, int] = field(default_factory=dict, metadata={"label": "reason"})


class LakeSink:
    """One consumer in the lake sink's group; `run()` until stopped or idle."""

    def __init__(self, settings: Settings, root: Path | str) -> None:
        self.settings = settings
        self.writer = LakeWriter(root, settings.lake)
        self.stats = SinkStats()
        self.stop = threading.Event()
        self._tables: dict[str, TableSpec] = {
            topic_name(settings.kafka, spec.topic_suffix): spec for spec in TABLES.values()
        }
        self._compacted_topics = {
            topic_name(settings.kafka, spec.suffix) for spec in TOPICS if spec.compacted
        }
        self._positions: Positions = {}
        self.last_activity = time.monotonic()
        self._consumer: KafkaConsumer | None = None
        self._producer: KafkaProducer | None = None
        self._blocked: str | None = None  # why writes fail, while they do
        self._retry_at = 0.0
        self._unmarked: Positions = {}  # committed, not yet recorded under lake/_offsets
        self._replay_from: Positions = {}  # first offset handled since the last commit


    def readiness(self) -> tuple[bool, str]:
        """/readyz: the consumer has joined the lake group (it reached Kafka)."""
        if self._consumer is None:
            return False, "starting"
        if self._blocked is not None:
            return False, f"lake blocked ({self._blocked}); offsets not committed"
        return consumer_readiness(self._consumer, self.settings.lake.group_id)

    def run(self, idle_exit_s: float | None = None) -> SinkStats:
        kafka = self.settings.kafka
        check_login(kafka)  # a refused login fails here, clearly, not after a bootstrap timeout
        self._consumer = KafkaConsumer(
            **client_kwargs(kafka),
            client_id=f"{kafka.client_id}-lake",
            group_id=self.settings.lake.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=10_000,
            session_timeout_ms=self.settings.lake.session_timeout_s * 1000,
            heartbeat_interval_ms=min(3000, self.settings.lake.session_timeout_s * 1000 // 3),
            reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
        )
        self._producer = KafkaProducer(
            **client_kwargs(kafka), acks="all", client_id=f"{kafka.client_id}-lake-dlq",
            reconnect_backoff_max_ms=RECONNECT_BACKOFF_MAX_MS,
        )
        self._consumer.subscribe(sorted(self._tables), listener=_FlushOnRevoke(self))
        try:
            self._loop(idle_exit_s)
            self.commit()
        finally:
            self._consumer.close(autocommit=False)
            self._producer.close()
        return self.stats

    def _loop(self, idle_exit_s: float | None) -> None:
        assert self._consumer is not None
        lake = self.settings.lake
        last_commit = self.last_activity = time.monotonic()
        while not self.stop.is_set():
            batches = self._consumer.poll(timeout_ms=200)
            now = time.monotonic()
            for records in batches.values():
                for record in records:
                    self._handle(record)
                self.last_activity = now
            if self._blocked is not None:
                # partitions paused: poll only keeps us in the group; retry the same write
                if now >= self._retry_at:
                    self.commit()
                    last_commit = time.monotonic()
                continue
            due = self._positions and now - last_commit >= lake.flush_seconds
            if self.writer.pending_rows >= lake.flush_rows or due:
                self.commit()
                last_commit = time.monotonic()
            # idle only counts while we hold partitions: joining a group can take a session
            # timeout when a crashed member still holds them
            holding = bool(self._consumer.assignment())
            if idle_exit_s is not None and holding and now - self.last_activity >= idle_exit_s:
                return

    def _handle(self, record: Any) -> None:
        spec = self._tables[record.topic]
        source = (record.topic, record.partition, record.offset)
        self.stats.records += 1
        try:
            event = decode(record.value, spec.event, self.settings.kafka.max_value_bytes)
        except DecodeError as exc:
            if exc.reason == "tombstone" and self._compacted(record.topic):
                self.stats.tombstones += 1  # compaction's delete marker: there is no row
            else:
                self._dead_letter(record, str(exc), exc.reason)
        else:
            self.writer.add(spec.name, event, source)
            self.stats.tables[spec.name] = self.stats.tables.get(spec.name, 0) + 1
        self._positions[(record.topic, record.partition)] = record.offset + 1
        self._replay_from.setdefault((record.topic, record.partition), record.offset)

    def _compacted(self, topic: str) -> bool:
        return topic in self._compacted_topics

    def _dead_letter(self, record: Any, error: str, reason: str) -> None:
        assert self._producer is not None
        # the broker's timestamp; a record without a sane one gets the time we saw it
        stamp = record.timestamp or 0
        ts = stamp if stamp >= 10**12 else int(time.time() * 1000)
        letter = dead_letter(
            ts_ms=ts,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            raw=record.value,
            error=error,
            reason=reason,
        )
        self._producer.send(
            topic_name(self.settings.kafka, "dlq"), value=encode(letter), key=record.key
        )
        self.stats.dead_letters += 1
        log.warning(
            "dead letter %s[%d]@%d (%s): %s",
            record.topic,
            record.partition,
            record.offset,
            reason,
            error[:500],
        )

    def commit(self) -> bool:
        """Files renamed, dead letters acknowledged, then offsets committed, then marked.

        False when the files could not be written: then nothing is committed, the partitions
        are paused and what we hold is kept for the next try."""
        assert self._consumer is not None and self._producer is not None
        if not self._positions:
            return True
        try:
            self.writer.flush()
        except SinkError as exc:
            self._block(write_error_reason(exc), exc, self.stats.write_errors)
            return False
        self._producer.flush()
        positions = self._positions
        try:
            self._consumer.commit(
                {
                    TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)
                    for (topic, partition), offset in positions.items()
                },
                timeout_ms=COMMIT_TIMEOUT_MS,
            )
        except CommitFailedError:
            # the group moved on while we could not reach it: what we wrote is replayed (by
            # us or the partitions' new owner) from the last commit and rewrites the same files
            _count(self.stats.commit_errors, "rebalanced")
            log.warning("lake: offsets refused by the group (rebalanced); replaying from the "
                        "last commit")
            self.give_up_held()
            return False
        except KafkaError as exc:
            self._block("broker_unavailable", exc, self.stats.commit_errors)
            return False
        self._positions, self._replay_from = {}, {}
        if self._blocked is not None:
            self._unblock()
        self._mark(positions)
        self.stats.commits += 1
        self.stats.rows, self.stats.files = self.writer.rows_written, self.writer.files_written
        shown = ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(positions.items()))
        log.info("committed %s", shown)
        return True

    def _mark(self, positions: Positions) -> None:
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

    def _block(self, reason: str, exc: Exception, counts: dict[str, int]) -> None:
        assert self._consumer is not None
        _count(counts, reason)
        if self._blocked is None:
            self._blocked = reason
            self.stats.writes_blocked = 1
            # stop fetching: we keep what we hold, and the file names must not change (a
            # replay rewrites the files of one flush, not of two flushes in a row)
            self._consumer.pause(*self._consumer.assignment())
        self._retry_at = time.monotonic() + RETRY_WRITE_S
        log.error(
            "lake blocked (%s): offsets not committed, partitions paused; "
            "retrying every %.0f s: %s", reason, RETRY_WRITE_S, exc,
        )

    def _unblock(self) -> None:
        assert self._consumer is not None
        log.warning("lake writes succeed again after %s; resuming", self._blocked)
        self._blocked = None
        self.stats.writes_blocked = 0
        self._consumer.resume(*self._consumer.paused())

    def give_up_held(self) -> None:
        """Drop what we hold (partitions revoked while writes fail, or a commit the group
        refused): its offsets were never committed, so it is replayed from the last commit.
        The client keeps its position for a partition the group gives back to us, so seek
        those back ourselves."""
        assert self._consumer is not None
        self.writer.discard()
        owned = self._consumer.assignment()
        for (topic, partition), offset in self._replay_from.items():
            if TopicPartition(topic, partition) in owned:
                self._consumer.seek(TopicPartition(topic, partition), offset)
        self._positions, self._replay_from = {}, {}
        if self._blocked is not None:
            log.warning("lake: partitions revoked while blocked (%s); their records are "
                        "replayed", self._blocked)
            self._blocked = None
            self.stats.writes_blocked = 0
            self._consumer.resume(*self._consumer.paused())


def _count(counts: dict[str, int], reason: str) -> None:
    counts[reason] = counts.get(reason, 0) + 1


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


class _FlushOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, sink: LakeSink) -> None:
        self.sink = sink

    def on_partitions_revoked(self, revoked: Any) -> None:
        # Whatever we hold must be committed before another consumer resumes these partitions;
        # if it cannot be written, it must be dropped (the new owner replays it)
        if not self.sink.commit():
            self.sink.give_up_held()

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.sink.last_activity = time.monotonic()
        log.info("assigned %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))


def run_until_signalled(
    settings: Settings, root: Path | str, idle_exit_s: float | None = None
) -> SinkStats:
    """Run a LakeSink; SIGTERM/SIGINT stop it after a last flush and commit."""
    sink = LakeSink(settings, root)
    serve_stats("lake_sink", sink.stats, settings.metrics, sink.readiness)

    def stop(signum: int, frame: object) -> None:
        sink.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return sink.run(idle_exit_s)
