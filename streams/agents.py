"""The agents: the faust driver of the stage table in pipeline/stages/topology.py.

One agent per stage, reading the stage's input topics. Records are decoded and their keys
checked (`stage.key`): a batch record's values each. The values an agent has at once of one
partition (a batch record's; faust's `take` batch; what the Aligner releases) run through the
stage's pure functions in one call (`Stage.items`, `run_batch`) over a `KafkaPart`: the key
states of the partition in the stage's table (context.py keeps them, and one roll-back point
per batch: a snapshot of each changed state, or the batch to replay), the partition's robust
clocks, the settings. Their outputs are queued to their topics.

Record handling is synchronous: it computes everything, writes the state, then queues the
sends, so nothing else runs between reading a key's state and writing it back. Any record it
cannot handle — undecodable, wrongly keyed, or one that makes a stage raise — becomes a dead
letter, and the stream goes on. Agents run with concurrency 1 (faust #606 loses messages with
more); throughput comes from partitions and workers.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from pipeline.errors import DecodeError
from pipeline.model import Action, Alert, Event, Finding
from pipeline.stages import telemetry, topology
from pipeline.stages.align import Aligner
from pipeline.stages.base import Out, Refusal, Stage
from pipeline.stages.clock import ClockName, Family, RobustClock
from pipeline.stages.telemetry_state import TelemetryState, family_of
from pipeline.wire.batches import BATCHED, OUTPUT_BATCHED, is_batch, partition_of, unpack
from pipeline.wire.codec import decode
from pipeline.wire.internal import HEALTH_TOPICS as HEALTH_TOPICS
from pipeline.wire.internal import INVENTORY as INVENTORY
from pipeline.wire.internal import TELEMETRY_TABLE
from pipeline.wire.internal import TELEMETRY_TOPICS as TELEMETRY_TOPICS
from pipeline.wire.topics import record_key
from streams.acks import Ack
from streams.context import Context, Futures
from streams.records import Record, decode_value, key_text, unexpected_error

log = logging.getLogger("fleetpulse.worker")
S = TypeVar("S")
ALIGN_MAX_HELD = 20_000  # records held for ordering, at most, per agent


class KafkaPart:
    """stages.base.Part over one partition of a stage's table (Context.load/store); `batch`:
    it runs a batch of values (run_batch)."""

    def __init__(self, ctx: Context, table: str, partition: int, batch: bool = False) -> None:
        self.ctx = ctx
        self.table = table
        self.partition = partition
        self.wall_ms = int(time.time() * 1000)
        self.batch = batch

    @property
    def settings(self) -> Any:
        return self.ctx.settings

    def get(self, key: str, cls: type[S]) -> S | None:
        return self.ctx.load(self.table, key.encode(), cls)

    def put(self, key: str, state: Any) -> None:
        self.ctx.store(self.table, self.partition, key.encode(), state)

    def clock(self, family: ClockName) -> RobustClock:
        return self.ctx.clocks.clock(family, self.partition)

    def observe(self, family: ClockName, key: str, ts: int) -> list[int]:
        return self.ctx.clocks.observe(family, self.partition, key, ts, time.monotonic())

    def keys(self, family: Family | None) -> list[str]:
        keys = []
        for raw_key, known in self.ctx.clocks.keys_of(self.partition):
            if known is None:  # recovered from the changelog: its state says what it is
                state = self.ctx.load(self.table, raw_key, TelemetryState)
                if state is None:
                    continue
                known = family_of(state)
                self.ctx.clocks.add_key(self.partition, raw_key, known)
            if family is None or known == family:
                keys.append(raw_key.decode())
        return keys

    def note_key(self, key: str, family: Family) -> None:
        self.ctx.clocks.add_key(self.partition, key.encode(), family)

    def count(self, what: str) -> None:
        if what == "unknown_target":
            self.ctx.metrics.unknown_targets.inc()
        elif what == "impossible_values":
            self.ctx.metrics.impossible_values.inc()

    def failed(self, key: str, now_ms: int, exc: Exception) -> None:
        if self.batch:  # its key's roll-back point is before the batch: the values one by one
            raise _AloneError(key) from exc
        log.error("staleness check of %r at %d failed", key, now_ms, exc_info=exc)
        self.ctx.metrics.errors.labels(f"{self.table}-tick").inc()
        self.ctx.roll_back(self.table, key.encode())  # back to the key's last good state


def send_all(ctx: Context, outs: list[Out], record: Record | None) -> Futures:
    """Queue a stage's outputs; a refusal is a dead letter of the record it came from."""
    futures: Futures = []
    for out in outs:
        event = out.event
        if isinstance(event, Refusal):
            assert record is not None  # only a record can be refused
            futures.append(ctx.send_dead_letter(record, event.message, event.reason))
        elif event is None:  # a member left: its tombstone, to the capacity stage
            if out.topic in BATCHED:  # after the values queued before it (one partition)
                futures.extend(ctx.write_queued())
            futures.append(ctx.send_tombstone(out.topic, out.key))
        elif out.topic in BATCHED:  # written with the batch, at the next flush
            ctx.queue(out.topic, out.key, event)
        elif out.topic in OUTPUT_BATCHED and ctx.settings.kafka.utilization_batch:
            # a record per partition and flush, in the partition the value's own key picks
            home = partition_of(out.key, ctx.settings.kafka.partitions)
            ctx.queue(out.topic, out.key, event, group=home)
        elif isinstance(event, Finding) and out.topic == "findings":
            futures.append(ctx.send_finding(event))
        elif isinstance(event, Action) and out.topic == "actions":
            futures.append(ctx.send_action(event))
        elif isinstance(event, Alert) and out.topic == "alerts":
            futures.append(ctx.send_alert(event))
        else:
            futures.append(ctx.send(out.topic, out.key, event))
    return futures


def tick(ctx: Context, family: Family, partition: int, boundaries: list[int]) -> Futures:
    """The `family` clock of a quiet `partition` crossed `boundaries` (app.py's lag timer)."""
    part = KafkaPart(ctx, TELEMETRY_TABLE, partition)
    try:
        outs = telemetry.tick(part, family, boundaries)
    except Exception:  # beyond a key's own check (those roll that key back, `failed`)
        log.exception("staleness checks of partition %d at %s failed", partition, boundaries)
        ctx.metrics.errors.labels("telemetry-tick").inc()
        ctx.roll_back(TELEMETRY_TABLE)
        return []
    ctx.commit()
    return send_all(ctx, outs, None)


class Entry(NamedTuple):
    """One value to run through a stage: of a record, or of a batch record (`where` names it
    in a dead letter)."""

    record: Record
    event: Event | None
    key: str
    where: str = ""


def entries_of(ctx: Context, stage: Stage, record: Record) -> tuple[list[Entry], Futures]:
    """A record's values, decoded and keyed (`stage.key`). One that cannot be (undecodable,
    wrongly keyed: no state touched) is a dead letter of the record, naming the value in a
    batch record (pipeline/wire/batches.py), and the others go on."""
    if not is_batch(record):
        ctx.count("values_in", record.topic)
        try:
            event = _value(ctx, record)
            return [Entry(record, event, stage.key(event, key_text(record)))], []
        except DecodeError as exc:
            return [], [ctx.send_dead_letter(record, str(exc), exc.reason)]
    held = ctx.unpacked.pop((record.topic, record.partition, record.offset), None)
    try:
        pairs, first = held if held is not None else (unpack(record.value), None)
    except DecodeError as exc:
        return [], [ctx.send_dead_letter(record, str(exc), exc.reason)]
    ctx.count("values_in", record.topic, len(pairs))
    own = record.topic in ctx.producer_batched  # each value keyed by its own target
    limit = ctx.settings.kafka.max_value_bytes
    entries: list[Entry] = []
    futures: Futures = []
    for index, (content_type, raw) in enumerate(pairs):
        where = f"value {index}: "
        try:
            value = first if index == 0 and first is not None else None  # (Agent.ready's)
            if value is None:
                value = decode(raw, ctx.value_types[record.topic], limit, content_type)
            key = stage.key(value, _own_key(ctx, record, value) if own else key_text(record))
        except DecodeError as exc:
            futures.append(ctx.send_dead_letter(record, f"{where}{exc}", exc.reason))
            continue
        entries.append(Entry(record, value, key, where))
    return entries, futures


class _AloneError(Exception):
    """A staleness check raised inside a batch: the batch is run again one value at a time,
    where the check rolls back its own key only (KafkaPart.failed)."""


def run_batch(ctx: Context, stage: Stage, entries: list[Entry]) -> list[Futures]:
    """Values of one partition through the stage at once (`Stage.items`), with one roll-back
    point for the batch: one snapshot of each state it changed (telemetry), or one journal
    entry to replay (the others). If the stage raises, its states (and, for the telemetry
    stage, the partition's clocks) go back to before the batch, and its values run again one
    at a time, so the one to blame is a dead letter and every other is applied once.
    Returns each value's futures."""
    if len(entries) == 1:
        return [run_one(ctx, stage, entries[0])]
    partition = entries[0].record.partition
    part = KafkaPart(ctx, stage.table, partition, batch=True)
    clocks = None if stage.replayable else ctx.clocks.checkpoint(partition)
    items = [(entry.event, entry.key) for entry in entries]
    try:
        results = stage.items(part, items)
    except Exception:
        ctx.roll_back(stage.table, counted=False)  # back to before the batch
        if clocks is not None:
            ctx.clocks.restore(partition, clocks)
        return [run_one(ctx, stage, entry) for entry in entries]
    part.batch = False  # a replay after a later roll-back runs it as it ran now
    ctx.handled(stage.table, functools.partial(stage.items, part, items))
    return [
        send_all(ctx, outs, entry.record) for outs, entry in zip(results, entries, strict=True)
    ]


def run_one(ctx: Context, stage: Stage, entry: Entry) -> Futures:
    """One value through the stage, with a roll-back point of its own; a value that makes the
    stage raise is a dead letter and the stage's states go back to before it."""
    part = KafkaPart(ctx, stage.table, entry.record.partition)
    record = entry.record
    try:
        outs = stage.on_item(part, entry.event, entry.key)
    except DecodeError as exc:  # raised before any state was touched
        return [ctx.send_dead_letter(record, f"{entry.where}{exc}", exc.reason)]
    except Exception as exc:
        log.exception(
            "%s: record %s[%d]@%d %s", stage.name, record.topic, record.partition, record.offset,
            entry.where,
        )  # fmt: skip
        ctx.metrics.errors.labels(stage.name).inc()
        ctx.roll_back(stage.table)
        error = entry.where + unexpected_error(stage.name, exc)
        return [ctx.send_dead_letter(record, error, "error")]
    ctx.handled(stage.table, functools.partial(stage.on_item, part, entry.event, entry.key))
    return send_all(ctx, outs, record)


# --- the loop -----------------------------------------------------------------------------

BATCH_MAX = 500  # values run through a stage at once, at most (one roll-back point each)


def handle_records(ctx: Context, stage: Stage, records: list[Held]) -> None:
    """Records as they came (one, a batch faust gave, what an Aligner released): their values
    run through the stage in batches of one partition, and each record's outputs go to the
    Settler with its ack. A record it cannot handle becomes a dead letter, never a crash."""
    started = time.perf_counter()
    plan: list[Futures] = []
    pending: list[Entry] = []
    owners: list[int] = []  # which record (index in `plan`) each pending entry is of

    def drain() -> None:
        for owner, futures in zip(owners, run_batch(ctx, stage, pending), strict=True):
            plan[owner].extend(futures)
        pending.clear()
        owners.clear()

    for record, _ack in records:
        entries, futures = _entries_guarded(ctx, stage, record)
        plan.append(futures)
        if pending and (
            pending[0].record.partition != record.partition or len(pending) >= BATCH_MAX
        ):
            drain()
        pending.extend(entries)
        owners.extend([len(plan) - 1] * len(entries))
        ctx.next_offset[(record.topic, record.partition)] = record.offset + 1
    if pending:
        drain()
    each = (time.perf_counter() - started) / len(records) if records else 0.0
    latency = ctx.metrics.latency.labels(stage.name)
    for (_record, ack), futures in zip(records, plan, strict=True):
        latency.observe(each)
        ctx.settler.add(ack, futures)


def handle_record(ctx: Context, stage: Stage, record: Record) -> Futures:
    """One record through the stage (tests; the agents call handle_records): its futures."""
    entries, futures = _entries_guarded(ctx, stage, record)
    ctx.next_offset[(record.topic, record.partition)] = record.offset + 1
    for done in run_batch(ctx, stage, entries) if entries else []:
        futures.extend(done)
    return futures


def _entries_guarded(ctx: Context, stage: Stage, record: Record) -> tuple[list[Entry], Futures]:
    try:
        return entries_of(ctx, stage, record)
    except Exception as exc:  # a bug in decoding: the record is a dead letter, not a crash
        log.exception("%s: record %s[%d]@%d", stage.name, record.topic, record.partition,
                      record.offset)  # fmt: skip
        ctx.metrics.errors.labels(stage.name).inc()
        return [], [ctx.send_dead_letter(record, unexpected_error(stage.name, exc), "error")]


def _value(ctx: Context, record: Record) -> Event | None:
    value = ctx.decoded.pop((record.topic, record.partition, record.offset), None)
    if value is None and record.value is None and record.topic in ctx.tombstoned:
        # normal on a compacted topic: the target left the inventory
        ctx.count("tombstones", record.topic)
        return None
    if value is None:
        limit = ctx.settings.kafka.max_value_bytes
        value = decode_value(record, ctx.value_types[record.topic], limit)
    return value


def _own_key(ctx: Context, record: Record, event: Event | None) -> str:
    """The value's own key, if it belongs to the record's partition: a target's state lives in
    the partition its key picks, whoever batched its values."""
    key = record_key(event) if event is not None else ""
    home = partition_of(key, ctx.settings.kafka.partitions)
    if home != record.partition:
        raise DecodeError(
            field="key",
            expected=f"a value of partition {record.partition}, as the batch record",
            got=f"{key!r}, of partition {home} (keys decide partitions)",
        )
    return key


Held = tuple[Record, Ack]


@dataclass
class Agent:
    """One stage's agent, and the Aligner that orders its co-partitioned inputs."""

    ctx: Context
    stage: Stage
    aligner: Aligner[Held] | None

    @property
    def name(self) -> str:
        return self.stage.name

    def receive(self, record: Record, ack: Ack) -> None:
        self.process(self.ready(record, ack))

    def ready(self, record: Record, ack: Ack) -> list[Held]:
        """What may be processed now that `record` came: itself, or what the Aligner
        releases (it holds records of its inputs while a partition catches up)."""
        ctx = self.ctx
        ctx.count("records_in", record.topic)
        if self.aligner is None or record.topic not in self.aligner.rank:
            return [(record, ack)]
        try:
            limit = ctx.settings.kafka.max_value_bytes
            if is_batch(record):  # held at its first value's time (a producer's, in order)
                pairs = unpack(record.value)
                content_type, raw = pairs[0]
                value = decode(raw, ctx.value_types[record.topic], limit, content_type)
                ctx.unpacked[(record.topic, record.partition, record.offset)] = (pairs, value)
            else:
                value = decode_value(record, ctx.value_types[record.topic], limit)
                ctx.decoded[(record.topic, record.partition, record.offset)] = value
        except Exception:  # entries_of makes it a dead letter with the reason
            return [(record, ack)]  # order is moot: it goes to the dead letters
        ts = getattr(value, "ts", 0)
        self.aligner.hold(record.topic, record.partition, ts, (record, ack), time.monotonic())
        return self.aligner.release(time.monotonic()) if self.aligner.held else []

    def release(self) -> None:
        if self.aligner is not None and self.aligner.held:
            self.process(self.aligner.release(time.monotonic()))

    def process(self, records: list[Held]) -> None:
        if records:
            handle_records(self.ctx, self.stage, records)

    async def _take(self, stream: Any, take: int, within_s: float) -> None:
        """Batches of events from faust (acked by the Settler once their outputs are), each
        run through the stage at once."""
        async for events in stream.noack_take(take, within_s):
            ready: list[Held] = []
            for event in events:
                ready += self.ready(event.message, functools.partial(stream.ack, event))
            self.process(ready)
            if self.ctx.settler.full():
                await self.ctx.settler.settle()

    def agent(self) -> Callable[[Any], Any]:
        async def run(stream: Any) -> None:  # a faust Stream
            worker = self.ctx.settings.worker
            if worker.take:
                await self._take(stream, worker.take, worker.ack_interval_ms / 1000)
                return
            manual = stream.noack()
            async for event in manual.events():
                self.receive(event.message, functools.partial(manual.ack, event))
                if self.ctx.settler.full():
                    await self.ctx.settler.settle()

        run.__name__ = run.__qualname__ = self.name  # faust names agents after their function
        return run


def _grace(ctx: Context, topics: list[str]) -> Callable[[int], float]:
    """The Aligner's grace for a partition: the configured one while it catches up."""
    grace_s = ctx.settings.worker.align_grace_ms / 1000
    if ctx.settings.worker.align_always:
        return lambda partition: grace_s
    return lambda partition: grace_s if ctx.behind(topics, partition) else 0.0


def register(ctx: Context) -> None:
    """An agent for every stage of the table, reading its input topics."""
    for stage in topology.STAGES:
        names = [ctx.name(topic) for topic in stage.inputs]
        aligner: Aligner[Held] | None = None
        if stage.aligned:
            aligned = [ctx.name(topic) for topic in stage.aligned]
            aligner = Aligner(aligned, _grace(ctx, aligned), ALIGN_MAX_HELD)
        agent = Agent(ctx, stage, aligner)
        if stage.replayable:
            ctx.replayable(stage.table)
        ctx.stages.append(agent)
        channel = ctx.app.topic(
            *names,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )
        ctx.app.agent(channel, name=stage.name, concurrency=1)(agent.agent())
