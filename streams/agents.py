"""The agents: the faust driver of the stage table in pipeline/stages/topology.py.

One agent per stage, reading the stage's input topics. A record is decoded, its key checked
(`stage.key`), and the stage's pure `on_item` runs over a `KafkaPart`: the key states of the
record's partition in the stage's table (context.py keeps them, and what a roll-back needs:
a snapshot, or the records to replay), the partition's robust clocks, the settings. Its
outputs are queued to their topics.

A record handler is synchronous: it computes everything, writes the state, then queues the
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
from typing import Any, TypeVar

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
    """stages.base.Part over one partition of a stage's table (Context.load/store)."""

    def __init__(self, ctx: Context, table: str, partition: int) -> None:
        self.ctx = ctx
        self.table = table
        self.partition = partition
        self.wall_ms = int(time.time() * 1000)

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


def handle(
    ctx: Context, stage: Stage, record: Record, event: Event | None, own_key: bool = False
) -> Futures:
    """`own_key`: a value of a producer's batch (pipeline/wire/batches.py), keyed by its own
    target."""
    key = stage.key(event, _own_key(ctx, record, event) if own_key else key_text(record))
    part = KafkaPart(ctx, stage.table, record.partition)
    outs = stage.on_item(part, event, key)
    ctx.handled(stage.table, functools.partial(stage.on_item, part, event, key))
    return send_all(ctx, outs, record)


# --- the loop -----------------------------------------------------------------------------


def handle_record(ctx: Context, stage: Stage, record: Record) -> Futures:
    """Decode and run the stage; a record it cannot handle becomes a dead letter, never a
    crash. (For an agent with an Aligner, decoding happened before: see `Agent.receive`.)"""
    started = time.perf_counter()
    try:
        if is_batch(record):
            return _guarded(ctx, stage, record, lambda: handle_batch(ctx, stage, record))
        ctx.metrics.values_in.labels(record.topic).inc()
        return _guarded(ctx, stage, record, lambda: handle(ctx, stage, record, _value(ctx, record)))
    finally:
        ctx.next_offset[(record.topic, record.partition)] = record.offset + 1
        ctx.metrics.latency.labels(stage.name).observe(time.perf_counter() - started)


def _value(ctx: Context, record: Record) -> Event | None:
    value = ctx.decoded.pop((record.topic, record.partition, record.offset), None)
    if value is None and record.value is None and record.topic == ctx.name(INVENTORY):
        # normal on a compacted topic: the target left the inventory
        ctx.metrics.tombstones.labels(record.topic).inc()
        return None
    if value is None:
        limit = ctx.settings.kafka.max_value_bytes
        value = decode_value(record, ctx.value_types[record.topic], limit)
    return value


def handle_batch(ctx: Context, stage: Stage, record: Record) -> Futures:
    """Each value of a batch record in turn (pipeline/wire/batches.py), as if each were a
    record; one that cannot be handled is a dead letter (of the whole record, naming the
    value), and the others go on."""
    held = ctx.unpacked.pop((record.topic, record.partition, record.offset), None)
    pairs, first = held if held is not None else (unpack(record.value), None)
    ctx.metrics.values_in.labels(record.topic).inc(len(pairs))
    futures: Futures = []
    for index, (content_type, raw) in enumerate(pairs):
        value = first if index == 0 else None  # decoded already by Agent.receive
        run = functools.partial(_handle_packed, ctx, stage, record, content_type, raw, value)
        futures += _guarded(ctx, stage, record, run, f"value {index}: ")
    return futures


def _handle_packed(
    ctx: Context, stage: Stage, record: Record, content_type: str, raw: bytes,
    value: Event | None,
) -> Futures:
    if value is None:
        limit = ctx.settings.kafka.max_value_bytes
        value = decode(raw, ctx.value_types[record.topic], limit, content_type)
    return handle(ctx, stage, record, value, own_key=record.topic in ctx.producer_batched)


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


def _guarded(
    ctx: Context, stage: Stage, record: Record, run: Callable[[], Futures],
    where: str = "",
) -> Futures:
    """`run()`'s outputs, or the dead letter of `record` if it cannot be handled (`where`: which
    value of a batch)."""
    try:
        return run()
    except DecodeError as exc:  # raised by decoding or the key check: no state was touched
        return [ctx.send_dead_letter(record, f"{where}{exc}", exc.reason)]
    except Exception as exc:
        log.exception(
            "%s: record %s[%d]@%d %s", stage.name, record.topic, record.partition, record.offset,
            where,
        )  # fmt: skip
        ctx.metrics.errors.labels(stage.name).inc()
        ctx.roll_back(stage.table)
        return [ctx.send_dead_letter(record, where + unexpected_error(stage.name, exc), "error")]


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
        ctx = self.ctx
        ctx.metrics.records_in.labels(record.topic).inc()
        if self.aligner is None or record.topic not in self.aligner.rank:
            self.process([(record, ack)])
            return
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
        except Exception:  # handle_record makes it a dead letter with the reason
            self.process([(record, ack)])  # order is moot: it goes to the dead letters
            return
        ts = getattr(value, "ts", 0)
        self.aligner.hold(record.topic, record.partition, ts, (record, ack), time.monotonic())
        self.release()

    def release(self) -> None:
        if self.aligner is not None and self.aligner.held:
            self.process(self.aligner.release(time.monotonic()))

    def process(self, records: list[Held]) -> None:
        for record, ack in records:
            self.ctx.settler.add(ack, handle_record(self.ctx, self.stage, record))

    async def _take(self, stream: Any, take: int, within_s: float) -> None:
        """Batches of events from faust (acked by the Settler once their outputs are)."""
        async for events in stream.noack_take(take, within_s):
            for event in events:
                self.receive(event.message, functools.partial(stream.ack, event))
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
