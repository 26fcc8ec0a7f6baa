"""What the agents share: settings, topics, tables, metrics, the settler and the clocks.

Tables hold each key's state as bytes with bytes keys, so what is recovered from a changelog is
byte-for-byte what was written: `stages.base.encode_state` (msgpack) compressed with zlib at
level 1.
A node's detector state is ~10 kB of msgpack, rewritten with every scrape; compressed it is
~1-2 kB for ~0.1 ms of CPU, and the changelog stops being most of what the worker writes.

State is read through `load` and written through `store`; the decoded state is kept (the next
record of the key needs no decoding). Before the Settler closes a batch it calls `flush`, which
writes each changed key once — its table entry and a changelog record in the source record's
partition — so a node scraped eight times in a batch costs one write, and a record is acked
only after the states it changed are in the changelog. This also works outside a stream
iteration (the staleness timer), which faust's `table[key] = value` does not.

A record that makes a stage raise must not leave a half-changed state behind; `roll_back` puts
the stage's table back as it was after the last good record or batch of values (the agents
run the values they have of a partition through a stage at once, `Stage.items`:
agents.run_batch), in one of two ways:
- telemetry (`Stage.replayable` false: it reads clocks that have moved on since): once a batch
  went through, the states it changed are snapshot as msgpack (`commit`), once each however
  many of its values changed them, and a roll-back decodes them again;
- every other stage: the snapshot is what the last `flush` wrote, and the stage's records since
  then are kept (`journal`, one entry per batch) and replayed, outputs discarded. These states
  are large (a cluster's fleet state is ~400 kB at 1,250 nodes) and their records many;
  encoding one per record was half of the worker's CPU under the 10k-GPU load, and replays
  happen only when a stage has a bug.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import faust
import msgspec

from pipeline.config import Settings
from pipeline.model import Action, Alert, DeadLetter, Event, Finding
from pipeline.stages.base import decode_state, encode_state
from pipeline.stages.keys import health_key, target_name
from pipeline.wire import batches
from pipeline.wire import headers as cloudevents_headers
from pipeline.wire.codec import JSON, encode_as, record_headers
from pipeline.wire.internal import ANNOUNCE_INPUT as ANNOUNCE_INPUT
from pipeline.wire.internal import CAPACITY_INPUT, INTERNAL, INVENTORY
from pipeline.wire.internal import POLICY_INPUT as POLICY_INPUT
from pipeline.wire.internal import ZONE_INPUT as ZONE_INPUT
from pipeline.wire.topics import TOPICS, topic_name
from streams import tables
from streams.acks import Settler
from streams.clock import PartitionClocks
from streams.metrics import WorkerMetrics
from streams.records import Record

log = logging.getLogger("fleetpulse.worker")
S = TypeVar("S")
Futures = list[Awaitable[Any]]
Replay = Callable[[], object]

# Internal topics (created by faust, named after the app like its changelogs; declared with
# the stages that write and read them in pipeline/stages/, named in pipeline/wire/internal.py).
CATCHING_UP = 100  # records left to read in a partition: it is catching up, not live
INTERNAL_TOPICS = tuple(INTERNAL)
CE_TOPICS = cloudevents_headers.TOPICS  # the public topics only, not the internal copies


@dataclass
class Context:
    settings: Settings
    app: faust.App
    metrics: WorkerMetrics
    settler: Settler
    clocks: PartitionClocks = field(default_factory=PartitionClocks)
    topics: dict[str, Any] = field(default_factory=dict)  # faust Topics by suffix/internal
    tables: dict[str, Any] = field(default_factory=dict)  # faust Tables
    value_types: dict[str, type[Event]] = field(default_factory=dict)  # by full topic name
    # full names of the input topics whose batch records hold many keys (batches.py)
    producer_batched: frozenset[str] = frozenset()
    next_offset: dict[tuple[str, int], int] = field(default_factory=dict)
    # decoded states of the keys in use; states changed since the last flush, with their
    # partition and (telemetry only) msgpack snapshot, taken once the record that changed them
    # went through (`commit`); the records of the replayable stages since the last flush, by
    # table; and the generation (tables.py) and digest of what the table holds for each key
    cache: dict[tuple[str, bytes], Any] = field(default_factory=dict)
    dirty: dict[tuple[str, bytes], tuple[int, bytes | None]] = field(default_factory=dict)
    touched: dict[tuple[str, bytes], int] = field(default_factory=dict)  # by the record in hand
    journal: dict[str, list[Replay]] = field(default_factory=dict)
    written: dict[tuple[str, bytes], tuple[int, bytes]] = field(default_factory=dict)
    # values decoded on arrival (for their timestamps) and held by an Aligner, by coordinates
    decoded: dict[tuple[str, int, int], Event] = field(default_factory=dict)
    # the same for producers' batch records: their (content type, value) pairs, and the first
    # value decoded (its time is the batch's), so neither is decoded twice
    unpacked: dict[tuple[str, int, int], tuple[list[tuple[str, bytes]], Event]] = field(
        default_factory=dict)
    stages: list[Any] = field(default_factory=list)  # agents.Agent, in registration order
    backlog: dict[tuple[str, int], int] = field(default_factory=dict)  # from the lag timer
    backlog_at: float = 0.0  # monotonic time the lag timer last measured it
    # values for the internal topics the driver batches, written at the next flush (batches.py)
    queued: batches.Batches = field(default_factory=batches.Batches)
    # the labelled children of the per-topic counters, looked up once (`count`)
    children: dict[tuple[str, str], Any] = field(default_factory=dict)

    def count(self, counter: str, topic: str, amount: int = 1) -> None:
        """Add to one of the metrics' per-topic counters (`records_in`, `values_in`,
        `tombstones`), its child for `topic` (a full name) looked up once."""
        child = self.children.get((counter, topic))
        if child is None:
            child = self.children[(counter, topic)] = getattr(self.metrics, counter).labels(topic)
        child.inc(amount)

    def behind(self, topics: list[str], partition: int) -> bool:
        """Is this partition catching up on a backlog in any of `topics`?"""
        return any(self.backlog.get((t, partition), 0) > CATCHING_UP for t in topics)

    def name(self, suffix: str) -> str:
        name: str = self.topics[suffix].get_topic_name()
        return name

    @functools.cached_property
    def tombstoned(self) -> frozenset[str]:
        """Full names of the topics whose tombstones are values (a member left the inventory):
        the inventory, and the capacity stage's input the telemetry stage passes them on to."""
        return frozenset(self.name(t) for t in (INVENTORY, CAPACITY_INPUT))

    # --- state ------------------------------------------------------------------------------

    def load(self, table: str, key: bytes, cls: type[S]) -> S | None:
        cached = self.cache.get((table, key))
        if cached is not None:
            state: S = cached
            return state
        pending = self.dirty.get((table, key))
        try:
            if pending is not None and pending[1] is not None:
                packed = pending[1]
            else:
                raw = self.tables[table].data.get(key)
                if raw is None:
                    return None
                packed = zlib.decompress(tables.compressed_of(raw))
                self.written[(table, key)] = (tables.generation_of(raw), _digest(packed))
            state = decode_state(packed, cls)
        except (zlib.error, msgspec.DecodeError, msgspec.ValidationError) as exc:
            # a state written by an older release: start this key afresh (re-warm) rather
            # than stop the stream; the counter says how often that happens
            log.warning("table %s key %r: undecodable state (%s); starting afresh", table, key, exc)
            self.metrics.state_resets.labels(table).inc()
            return None
        self.cache[(table, key)] = state
        return state

    def store(self, table: str, partition: int, key: bytes, state: Any) -> Futures:
        """Keep `state` as the key's state; `flush` writes it to the table and its changelog."""
        self.cache[(table, key)] = state
        if table in self.journal:
            self.dirty[(table, key)] = (partition, None)
        else:
            self.touched[(table, key)] = partition
        return []

    def commit(self) -> None:
        """A record, a batch or a staleness check went through: snapshot the states it
        changed."""
        for table_key, partition in self.touched.items():
            self.dirty[table_key] = (partition, encode_state(self.cache[table_key]))
        self.touched.clear()

    def replayable(self, table: str) -> None:
        """`table`'s stage can be replayed: snapshot it per flush, not per record."""
        self.journal.setdefault(table, [])

    def handled(self, table: str, replay: Replay) -> None:
        """A record or batch of `table`'s stage went through: kept to replay (`replay` redoes
        it, outputs dropped) if the stage is replayable, else the states it changed snapshot."""
        if table in self.journal:
            self.journal[table].append(replay)
        else:
            self.commit()

    def roll_back(self, table: str, key: bytes | None = None, counted: bool = True) -> None:
        """A stage raised half-way: back to `table`'s states after the last good record or
        batch (for a staleness check, which changes each key on its own: `key`'s state only).
        `counted`: false for a batch about to be run again one value at a time (the value to
        blame is counted then)."""
        if counted:
            self.metrics.roll_backs.labels(table).inc()
        if table not in self.journal:  # decoded again from their last snapshots
            for table_key in [k for k in self.touched if k[0] == table and key in (None, k[1])]:
                del self.touched[table_key]
            self._drop(table, key)
            return
        for table_key in [k for k in self.dirty if k[0] == table]:
            del self.dirty[table_key]  # back to what the last flush wrote
        self._drop(table, None)
        replays, self.journal[table] = self.journal[table], []
        for replay in replays:
            try:
                replay()
            except Exception:  # it went through from these very states once: a stage bug
                log.exception("table %s: replay after a roll-back failed; skipped", table)
                self.roll_back(table)  # what the replays so far did, without this one
                continue
            self.journal[table].append(replay)

    def _drop(self, table: str, key: bytes | None) -> None:
        # every key of the table, not only those stored: a stage may change a state it read
        # and raise before it stores it
        for table_key in [k for k in self.cache if k[0] == table and key in (None, k[1])]:
            del self.cache[table_key]

    def flush(self) -> Futures:
        """Write each state changed since the last flush, once, unless it is what the table
        holds already (a staleness check that found nothing): the Settler calls this before it
        closes a batch, so a record is acked only once the states it changed are written."""
        futures: Futures = []
        # the assignment's generation fences the writes (tables.py); an unchanged state held
        # from an older generation is written again, once, so that this owner's claim is in
        # the changelog and a fenced worker's late write of the key cannot win a replay
        current = self.app.consumer_generation_id
        for (table, key), (partition, snapshot) in self.dirty.items():
            packed = snapshot or encode_state(self.cache[(table, key)])
            t = self.tables[table]
            generation, digest = t.generation_for(key, current), _digest(packed)
            if self.written.get((table, key)) == (generation, digest):
                continue
            futures.append(t.write(partition, key, zlib.compress(packed, 1), generation))
            self.written[(table, key)] = (generation, digest)
        self.dirty.clear()
        for replays in self.journal.values():
            replays.clear()
        futures.extend(self.write_queued())
        return futures

    def write_queued(self) -> Futures:
        """Produce the values queued for the batched topics now (at a flush, or before a
        tombstone that must follow them)."""
        return [self._produce(topic, batch_key, packed, batches.headers())
                for topic, batch_key, packed in self.queued.take()]

    def forget_unsettled(self) -> None:
        """Partitions were revoked: states changed by records not yet settled are dropped, not
        written. Those records are not acked, so whoever owns their partitions now processes
        them again; written after the rebalance, a state computed before it (a worker cut off
        past its session, say) would overwrite the new owner's in the changelog and fork the
        key's state when the partition comes back."""
        self.dirty.clear()
        self.touched.clear()
        self.cache.clear()
        self.decoded.clear()
        self.unpacked.clear()
        self.queued.clear()
        for replays in self.journal.values():
            replays.clear()

    def forget_written(self) -> None:
        """Tables are recovered from changelogs at a rebalance: what they hold is news (and
        nothing computed before the rebalance is written after it: see forget_unsettled)."""
        self.forget_unsettled()
        self.written.clear()

    # --- outputs ----------------------------------------------------------------------------

    def send(self, topic: str, key: str, event: Event) -> Awaitable[Any]:
        # samples passed on to the fleet stage are telemetry like the inputs they came from:
        # written in `kafka.telemetry_format` with their content-type; everything else JSON
        value, content_type = encode_as(event, self.settings.kafka.telemetry_format)
        # actions, alerts and node state carry CloudEvents headers for downstream consumers
        headers = cloudevents_headers.headers(event, value) if topic in CE_TOPICS else None
        if content_type != JSON:
            headers = [*(headers or []), *record_headers(content_type)]
        return self._produce(topic, key, value, headers)

    def queue(self, topic: str, key: str, event: Event, group: object = None) -> None:
        """Queue a value for a batched topic; `flush` writes it with its batch (the values of
        its `group`, by default of its key)."""
        value, content_type = encode_as(event, self.settings.kafka.telemetry_format)
        self.queued.add(topic, key, value, content_type, group)

    def send_tombstone(self, topic: str, key: str) -> Awaitable[Any]:
        return self._produce(topic, key, None, None)

    def _produce(
        self, topic: str, key: str, value: bytes | None, headers: list[tuple[str, bytes]] | None
    ) -> Awaitable[Any]:
        channel = self.topics[topic]
        counted = self.children.get(("out", topic))  # by the name it has here, labelled in full
        if counted is None:
            counted = self.children[("out", topic)] = self.metrics.records_out.labels(
                channel.get_topic_name())
        counted.inc()
        fut: Awaitable[Any] = channel.send_soon(key=key.encode(), value=value, headers=headers)
        return fut

    def send_finding(self, finding: Finding) -> Awaitable[Any]:
        self.metrics.findings.labels(finding.check, str(finding.healthy).lower()).inc()
        return self.send("findings", health_key(finding), finding)

    def send_action(self, action: Action) -> Awaitable[Any]:
        self.metrics.actions.labels(action.kind, str(action.dry_run).lower()).inc()
        return self.send("actions", target_name(action.target), action)

    def send_alert(self, alert: Alert) -> Awaitable[Any]:
        self.metrics.alerts.labels(alert.status, alert.labels.get("alertname", "")).inc()
        return self.send("alerts", alert.fingerprint, alert)

    def send_dead_letter(self, record: Record, error: str, reason: str) -> Awaitable[Any]:
        self.metrics.dead_letters.labels(record.topic, reason).inc()
        log.warning(
            "dead letter from %s[%d]@%d: %s", record.topic, record.partition, record.offset, error
        )
        # the broker timestamp (faust gives seconds): a replay of the same bad record produces
        # the same letter
        letter = DeadLetter.from_record(
            record, reason=reason, error=error, ts_ms=int(record.timestamp * 1000)
        )
        key = "" if record.key is None else record.key.decode("utf-8", errors="replace")
        return self.send("dlq", key, letter)


def _digest(packed: bytes) -> bytes:
    return hashlib.blake2b(packed, digest_size=16).digest()


def declare_topics(
    app: faust.App, settings: Settings
) -> tuple[dict[str, Any], dict[str, type[Event]]]:
    """faust topics for every FleetPulse topic (raw bytes) and the two internal ones."""
    topics: dict[str, Any] = {}
    value_types: dict[str, type[Event]] = {}
    for spec in TOPICS:
        name = topic_name(settings.kafka, spec.suffix)
        topics[spec.suffix] = app.topic(
            name, key_type=bytes, value_type=bytes, value_serializer="raw", key_serializer="raw"
        )
        value_types[name] = spec.value
    # created by the worker at start (streams/worker.py), like `fleetpulse topics create` does
    for internal, value in INTERNAL.items():
        name = f"{app.conf.id}-{internal}"
        topics[internal] = app.topic(
            name, key_type=bytes, value_type=bytes, value_serializer="raw", key_serializer="raw"
        )
        value_types[name] = value
    return topics, value_types
