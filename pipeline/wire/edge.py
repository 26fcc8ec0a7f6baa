"""One Kafka edge for the processes that are not faust agents (lake sink, alerts, actuator).

`run_edge` consumes topics into an `EdgeSink` in the quix-streams shape: `add(record)` for
every record, `flush()` to make everything added durable. The runner owns the rest, once:

- the consumer and the dead-letter producer, built with pipeline.wire.kafka's arguments;
- batching: a flush after `max_records` records or `max_interval_s` seconds, whichever first;
- ordering: flush, then the dead letters acknowledged by the broker, then the offsets
  committed, so a crash at any point replays from the last commit and loses nothing;
- bad input: `add` raises DecodeError → a DeadLetter.from_record on fleet.dlq, and on;
- failures: `flush` raises SinkError → nothing is committed, the partitions are paused, what
  the sink holds is kept and the same flush is retried with a jittered backoff of at most
  `retry_max_s` (a few seconds), then the partitions resume. A commit the broker cannot take
  is retried the same way; a commit the group refuses (we were away longer than the session)
  drops what is held (`discard`) and rewinds to the last commit, so it is replayed;
- a rebalance: the partitions are flushed and committed before they are given away (or,
  when the flush fails, dropped and left for the new owner to replay);
- reconnects: a broker away at start is waited for (wire/kafka.until_connected), and the
  clients retry the broker at least every 2 s (wire/kafka.STAY_CONNECTED);
- self-metrics (EdgeStats) and /readyz (`Edge.readiness`): not ready before the group is
  joined, while the broker does not answer, or while flushes fail.

A sink may also have `discard()` (drop what was added since the last flush: the records come
again) and `committed(positions)` (told the offsets committed, e.g. for compaction marks);
`flush()` may return the records a sink refused for good (Rejected) — they are dead-lettered
before the commit. A sink that finishes records in the background (`Settles`: the alert
targets, each on its own thread) says per partition where its unfinished records start: the
commit stops there, the loop goes on reading, and the rest is committed by a later flush.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from pipeline.config import Settings
from pipeline.errors import DecodeError, SinkError
from pipeline.model import DeadLetter
from pipeline.retry import Backoff
from pipeline.selfmetrics import consumer_readiness
from pipeline.wire.codec import encode
from pipeline.wire.kafka import (
    STAY_CONNECTED,
    check_login,
    client_kwargs,
    producer_kwargs,
    until_connected,
)
from pipeline.wire.topics import topic_name

if TYPE_CHECKING:
    from kafka.consumer.fetcher import ConsumerRecord
else:  # the Kafka client is imported only where Kafka is used
    ConsumerRecord = Any

log = logging.getLogger(__name__)

# a commit waits this long for the broker, then the runner pauses and retries (it would block
# the loop for the client's default minute otherwise)
COMMIT_TIMEOUT_MS = 5000
DLQ_TIMEOUT_S = 10.0  # dead letters the broker has not acknowledged by then: retried
POLL_MS = 200
METADATA_WAIT_S = 30.0  # how long to wait for a new topic's partitions before joining

# (topic, partition) -> the next offset to read: what a commit records
Positions = dict[tuple[str, int], int]


class EdgeSink(Protocol):
    def add(self, record: ConsumerRecord) -> None:
        """Take one record; raise DecodeError for bad input (it is dead-lettered, and on)."""

    def flush(self) -> Sequence[Rejected] | None:
        """Make everything added durable; raise SinkError when it cannot (no commit; the same
        flush is retried with backoff). May return records refused for good: dead-lettered."""


@runtime_checkable
class Discards(Protocol):
    def discard(self) -> None:
        """Drop what was added since the last successful flush: it is replayed."""


@runtime_checkable
class TracksCommits(Protocol):
    def committed(self, positions: Positions) -> None:
        """The offsets now committed (after a flush)."""


@runtime_checkable
class Settles(Protocol):
    def unsettled(self) -> Positions:
        """Per partition, the offset of the oldest record added but not finished yet: the
        commit stops there (partitions not named are finished up to what was added)."""

    def wait_settled(self) -> None:
        """On the way out, before the last commit: a moment to finish what is under way."""


@runtime_checkable
class TracksAssignment(Protocol):
    def assigned(self) -> None:
        """Partitions were assigned to this member (another may have written them since)."""


class Rejected(NamedTuple):
    """A record a sink refused for good at flush time (e.g. an HTTP 4xx)."""

    record: ConsumerRecord
    reason: str
    error: str


@dataclass
class EdgeStats:
    """Served on /metrics as fleetpulse_<process>_<field>."""

    records: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict, metadata={"label": "reason"})
    flushes: int = 0
    # failed flushes by reason (SinkError.reason: "disk_full", "delivery", …); nothing committed
    flush_errors: dict[str, int] = field(default_factory=dict, metadata={"label": "reason"})
    flush_blocked: int = field(default=0, metadata={"gauge": True})  # 1 while flushes fail
    commits: int = 0
    # offset commits refused: "broker_unavailable" (retried), "rebalanced" (replayed)
    commit_errors: dict[str, int] = field(default_factory=dict, metadata={"label": "reason"})
    # polls that failed because the broker could not be reached (the loop goes on)
    poll_errors: int = 0
    # records read but not yet committed (a restart now would read them again)
    commit_lag: int = field(default=0, metadata={"gauge": True})

    @property
    def dead_lettered(self) -> int:
        return sum(self.dead_letters.values())


@dataclass(frozen=True)
class EdgeOptions:
    max_records: int = 10_000  # a flush after this many records…
    max_interval_s: float = 5.0  # …or this long after the first record not yet flushed
    retry_initial_s: float = 0.25  # a failed flush or commit is retried after…
    retry_max_s: float = 2.0  # …at most this long
    session_timeout_s: int = 10
    # a flush may take this long before the group thinks the member is stuck (a drain waits
    # for PodDisruptionBudgets: the actuator sets it above its drain timeout)
    max_poll_interval_s: float = 300.0
    idle_exit_s: float | None = None  # return after this long without a record (tests, batch)


class Edge:
    """One consumer in a group, feeding one sink; `run()` until `stop` is set or idle."""

    def __init__(
        self,
        settings: Settings,
        *,
        name: str,
        topics: Sequence[str],
        group_id: str,
        sink: EdgeSink,
        stop: threading.Event,
        options: EdgeOptions = EdgeOptions(),
        stats: EdgeStats | None = None,
    ) -> None:
        self.settings, self.name, self.topics, self.group_id = settings, name, topics, group_id
        self.sink, self.stop, self.options = sink, stop, options
        self.stats = EdgeStats() if stats is None else stats
        self.last_activity = time.monotonic()
        self._consumer: Any = None
        self._producer: Any = None
        self._positions: Positions = {}  # to commit at the next flush
        self._committed: Positions = {}  # what this member last committed
        self._replay_from: Positions = {}  # first offset read since the last commit
        self._held = 0  # records read since the last flush
        self._first_held_at = 0.0
        self._letters: list[tuple[DeadLetter, bytes | None]] = []  # not yet acknowledged
        self._blocked: str | None = None  # why flushes fail, while they do
        self._waiting = "starting"  # why there is no consumer yet (the broker is away)
        self._retry_at = 0.0
        self._backoff = Backoff(options.retry_initial_s, options.retry_max_s)

    # --- readiness ----------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        """/readyz: joined the group, the broker answers, and flushes succeed."""
        if self._consumer is None:
            return False, self._waiting
        if self._blocked is not None:
            return False, f"{self.name} blocked ({self._blocked}); offsets not committed"
        return consumer_readiness(self._consumer, self.group_id)

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> EdgeStats:
        from kafka import KafkaConsumer, KafkaProducer

        kafka = self.settings.kafka
        check_login(kafka)  # a refused login fails here, clearly, not after a bootstrap timeout
        session_ms = self.options.session_timeout_s * 1000
        # a broker away at start is waited for (not ready meanwhile, and why), not an exit
        producer = until_connected(lambda: KafkaProducer(
            **producer_kwargs(kafka), **STAY_CONNECTED, acks="all",
            client_id=f"{kafka.client_id}-{self.name}-dlq",
            max_block_ms=int(DLQ_TIMEOUT_S * 1000),  # not the default minute, broker away
        ), kafka, self.name, self.stop, self._wait)
        consumer = until_connected(lambda: KafkaConsumer(
            **client_kwargs(kafka),
            **STAY_CONNECTED,
            client_id=f"{kafka.client_id}-{self.name}",
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=max(1, min(self.options.max_records, 10_000)),
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=min(3000, session_ms // 3),
            max_poll_interval_ms=int(self.options.max_poll_interval_s * 1000),
        ), kafka, self.name, self.stop, self._wait)
        if producer is None or consumer is None:  # stopped while waiting for the broker
            for client in (producer, consumer):
                if client is not None:
                    client.close()
            return self.stats
        self._producer, self._consumer = producer, consumer
        self._consumer.subscribe(sorted(self.topics), listener=_rebalance_listener(self))
        self._await_partitions()  # subscribed first: see there
        try:
            self._loop()
            if isinstance(self.sink, Settles):
                self.sink.wait_settled()
            self.commit()  # a last flush and commit on the way out
        finally:
            self._consumer.close(autocommit=False)
            self._producer.close(timeout=DLQ_TIMEOUT_S)
        return self.stats

    def _wait(self, reason: str) -> None:
        self._waiting = reason

    def _await_partitions(self) -> None:
        """Join the group only once the broker names every topic's partitions (or after
        METADATA_WAIT_S): a member that joins while a topic just created has none yet is
        assigned nothing until its next metadata refresh, minutes later.

        Called once subscribed and before the first poll (which joins): the refresh here gives
        kafka-python the subscription's partitions to join with. Joined without it, the leader
        assigned from an empty snapshot, the first refresh after the join differed from it, and
        the member rebalanced at once (seen as a revoke within a second of the first assignment).
        """
        deadline = time.monotonic() + METADATA_WAIT_S
        self._consumer.topics()  # a fresh metadata request, with the subscription in place
        missing = [t for t in self.topics if not self._consumer.partitions_for_topic(t)]
        while missing and time.monotonic() < deadline and not self.stop.wait(0.2):
            self._consumer.topics()  # a fresh metadata request (partitions_for_topic caches)
            missing = [t for t in missing if not self._consumer.partitions_for_topic(t)]
        if missing:
            log.warning("%s: no partitions known yet for %s; joining anyway", self.name,
                        ", ".join(missing))

    def _loop(self) -> None:
        idle_exit_s = self.options.idle_exit_s
        self.last_activity = time.monotonic()
        while not self.stop.is_set():
            polled = self._poll()
            now = time.monotonic()
            for records in polled.values():
                for record in records:
                    self._take(record)
                self.last_activity = now
            if self._blocked is not None:
                # partitions paused: poll only keeps us in the group; retry the same flush
                if now >= self._retry_at:
                    self.commit()
                continue
            if self._due(now):
                self.commit()
            # idle only counts while we hold partitions: joining a group can take a session
            # timeout when a crashed member still holds them
            holding = bool(self._consumer.assignment())
            if idle_exit_s is not None and holding and now - self.last_activity >= idle_exit_s:
                if self._caught_up():
                    return
                self.last_activity = now  # a slow first fetch on a busy machine is not idle

    def _poll(self) -> dict[Any, list[ConsumerRecord]]:
        """The next records; none while the broker cannot be reached. kafka-python 3 may raise
        a lost connection out of poll (a metadata refresh while the coordinator is looked for
        again, seen when the broker stops): the client reconnects, so the loop goes on, and
        /readyz says why (the coordinator's silence)."""
        from kafka.errors import KafkaError

        try:
            polled: dict[Any, list[ConsumerRecord]] = self._consumer.poll(timeout_ms=POLL_MS)
        except KafkaError as exc:
            if not exc.retriable:
                raise
            self.stats.poll_errors += 1
            log.warning("%s: poll: %s; trying again", self.name, exc)
            self.stop.wait(POLL_MS / 1000)
            return {}
        return polled

    def _caught_up(self) -> bool:
        """Every assigned partition read to its end (idle means nothing left, not a slow
        fetch); True when the broker cannot say, so an idle exit is never held up by it."""
        from kafka.errors import KafkaError

        assigned = list(self._consumer.assignment())
        try:
            ends = self._consumer.end_offsets(assigned)
            return all(self._consumer.position(tp) >= ends.get(tp, 0) for tp in assigned)
        except KafkaError:
            return True

    def _due(self, now: float) -> bool:
        if not self._positions:
            return False
        late = now - self._first_held_at >= self.options.max_interval_s
        return self._held >= self.options.max_records or late

    def _take(self, record: ConsumerRecord) -> None:
        self.stats.records += 1
        if self._held == 0:
            self._first_held_at = time.monotonic()
        self._held += 1
        try:
            self.sink.add(record)
        except DecodeError as exc:
            self._dead_letter(record, exc.reason, str(exc))
        where = (record.topic, record.partition)
        self._positions[where] = record.offset + 1
        self._replay_from.setdefault(where, record.offset)
        self.stats.commit_lag += 1

    def _dead_letter(self, record: ConsumerRecord, reason: str, error: str) -> None:
        letter = DeadLetter.from_record(record, reason=reason, error=error)
        self._letters.append((letter, record.key))
        _count(self.stats.dead_letters, reason)
        log.warning("%s: dead letter %s[%d]@%d (%s): %s", self.name, record.topic,
                    record.partition, record.offset, reason, letter.error[:500])  # redacted

    # --- flush, then dead letters, then commit ------------------------------------------

    def commit(self) -> bool:
        """Flush the sink, have the broker acknowledge the dead letters, commit the offsets.

        False when any step failed: nothing was committed; what is held is kept and the same
        commit is retried after a backoff (or given up, when the group moved on)."""
        if not self._positions:
            return True
        try:
            rejected = self.sink.flush() or ()
        except SinkError as exc:
            self._block(exc.reason, exc, self.stats.flush_errors)
            return False
        self._held = 0
        for item in rejected:
            self._dead_letter(item.record, item.reason, item.error)
        if not self._send_letters():
            return False
        return self._commit_offsets()

    def _send_letters(self) -> bool:
        from kafka.errors import KafkaError

        if not self._letters:
            return True
        dlq = topic_name(self.settings.kafka, "dlq")
        try:
            sent = [(letter, key, self._producer.send(dlq, value=encode(letter), key=key))
                    for letter, key in self._letters]
            self._producer.flush(timeout=DLQ_TIMEOUT_S)
        except KafkaError as exc:  # no metadata for fleet.dlq, or no acknowledgement in time
            self._block("dlq_unavailable", exc, self.stats.flush_errors)
            return False  # all are sent again: a letter twice is harmless, none is not
        failed = [(letter, key) for letter, key, future in sent if not future.succeeded()]
        if failed:
            self._letters = failed
            cause = next((f.exception for _, _, f in sent if f.failed()), "not acknowledged")
            self._block("dlq_unavailable", Exception(str(cause)), self.stats.flush_errors)
            return False
        self._letters = []
        return True

    def _commit_offsets(self) -> bool:
        from kafka.errors import CommitFailedError, KafkaError
        from kafka.structs import OffsetAndMetadata, TopicPartition

        positions = self._committable()
        if all(self._committed.get(where) == offset for where, offset in positions.items()):
            # a Settles sink finished nothing new: nothing to tell the broker
            if self._blocked is not None:
                self._unblock()  # the dead letters that blocked us went out
            return False
        try:
            self._consumer.commit(
                {
                    TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)
                    for (topic, partition), offset in positions.items()
                },
                timeout_ms=COMMIT_TIMEOUT_MS,
            )
        except CommitFailedError:
            # the group moved on while we could not reach it: what we flushed is replayed (by
            # us or the partitions' new owner) from the last commit
            _count(self.stats.commit_errors, "rebalanced")
            log.warning("%s: offsets refused by the group (rebalanced); replaying from the "
                        "last commit", self.name)
            self.give_up_held()
            return False
        except KafkaError as exc:
            self._block("broker_unavailable", exc, self.stats.commit_errors)
            return False
        done = self._advance(positions)
        self.stats.flushes += 1
        self.stats.commits += 1
        if self._blocked is not None:
            self._unblock()
        if isinstance(self.sink, TracksCommits):
            self.sink.committed(positions)
        shown = ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(positions.items()))
        log.info("%s: committed %s", self.name, shown)
        return done

    def _committable(self) -> Positions:
        """What may be committed now: everything read, or for a sink that `Settles`, each
        partition up to its oldest unfinished record."""
        if not isinstance(self.sink, Settles):
            return dict(self._positions)
        behind = self.sink.unsettled()
        return {where: min(offset, behind.get(where, offset))
                for where, offset in self._positions.items()}

    def _advance(self, committed: Positions) -> bool:
        """Forget what is committed; True when that is everything read."""
        self._committed = {**self._committed, **committed}
        for where, offset in committed.items():
            if offset >= self._positions[where]:
                del self._positions[where]
                self._replay_from.pop(where, None)
            else:  # a Settles sink still works on the rest: replayed from here if dropped
                self._replay_from[where] = offset
        self.stats.commit_lag = sum(self._positions[w] - committed[w] for w in self._positions)
        return not self._positions

    # --- failing and recovering ---------------------------------------------------------

    def _block(self, reason: str, exc: Exception, counts: dict[str, int]) -> None:
        _count(counts, reason)
        if self._blocked is None:
            self._blocked = reason
            self.stats.flush_blocked = 1
            # stop fetching: we keep what we hold, and the next flush covers the same records
            # (a replay then rewrites one flush's output, not two flushes' in a row)
            self._consumer.pause(*self._consumer.assignment())
        delay = self._backoff.next_delay()
        self._retry_at = time.monotonic() + delay
        log.error("%s blocked (%s): offsets not committed, partitions paused; retrying in "
                  "%.1f s: %s", self.name, reason, delay, exc)

    def _unblock(self) -> None:
        log.warning("%s: flushes succeed again after %s; resuming", self.name, self._blocked)
        self._blocked = None
        self.stats.flush_blocked = 0
        self._backoff.reset()
        self._consumer.resume(*self._consumer.paused())

    def give_up_held(self) -> None:
        """Drop what we hold (partitions revoked while flushes fail, or a commit the group
        refused): its offsets were never committed, so it is replayed from the last commit.
        The client keeps its position for a partition the group gives back to us, so seek
        those back ourselves. Dead letters not yet sent are dropped too: they come again."""
        from kafka.structs import TopicPartition

        if isinstance(self.sink, Discards):
            self.sink.discard()
        owned = self._consumer.assignment()
        for (topic, partition), offset in self._replay_from.items():
            if TopicPartition(topic, partition) in owned:
                self._consumer.seek(TopicPartition(topic, partition), offset)
        self._positions, self._replay_from, self._letters = {}, {}, []
        self._committed = {}
        self._held, self.stats.commit_lag = 0, 0
        if self._blocked is not None:
            log.warning("%s: partitions revoked while blocked (%s); their records are "
                        "replayed", self.name, self._blocked)
            self._blocked = None
            self.stats.flush_blocked = 0
            self._backoff.reset()
            self._consumer.resume(*self._consumer.paused())


def _count(counts: dict[str, int], reason: str) -> None:
    counts[reason] = counts.get(reason, 0) + 1


def _rebalance_listener(edge: Edge) -> Any:
    from kafka import AsyncConsumerRebalanceListener

    class FlushOnRevoke(AsyncConsumerRebalanceListener):  # type: ignore[misc]
        """kafka-python 3 calls the listener on its IO thread, which must stay free to carry
        the commit (a blocking client call from it raises): the flush and commit run on a
        worker thread while this coroutine yields to the IO loop until they are done. The
        loop thread that called poll() waits meanwhile, so the client is used by one thread
        at a time."""

        async def on_partitions_revoked(self, revoked: Any) -> None:
            # what we hold must be committed before another consumer resumes these
            # partitions; if it cannot be, it is dropped (the new owner replays it)
            done = threading.Event()
            worker = threading.Thread(target=_flush_or_give_up, args=(edge, done),
                                      name=f"{edge.name}-revoke", daemon=True)
            worker.start()
            net = edge._consumer._coordinator._net  # the client's own loop: its sleep yields
            while not done.is_set():
                await net.sleep(0.02)

        async def on_partitions_assigned(self, assigned: Any) -> None:
            edge.last_activity = time.monotonic()
            if isinstance(edge.sink, TracksAssignment):
                edge.sink.assigned()
            log.info("%s: assigned %s", edge.name,
                     sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))

    return FlushOnRevoke()


def _flush_or_give_up(edge: Edge, done: threading.Event) -> None:
    try:
        if not edge.commit():
            edge.give_up_held()
    except Exception:  # the rebalance must go on; what was not committed is replayed
        log.exception("%s: flush on revoke failed; what we hold is replayed", edge.name)
        edge.give_up_held()
    finally:
        done.set()


def run_edge(
    settings: Settings,
    *,
    name: str,
    topics: Sequence[str],
    group_id: str,
    sink: EdgeSink,
    stop: threading.Event,
    options: EdgeOptions = EdgeOptions(),
    stats: EdgeStats | None = None,
    on_start: Any = None,
) -> EdgeStats:
    """Consume `topics` in `group_id` into `sink` until `stop` is set (or idle, see
    EdgeOptions). `on_start(edge)` is called with the Edge before it connects, e.g. to point
    a /readyz at `edge.readiness`."""
    edge = Edge(settings, name=name, topics=topics, group_id=group_id, sink=sink, stop=stop,
                options=options, stats=stats)
    if on_start is not None:
        on_start(edge)
    return edge.run()


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop`: the runner flushes and commits, then returns."""

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
