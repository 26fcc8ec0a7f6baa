"""The embedded runtime: the whole pipeline in one process, no Kafka, deterministic.

A driver of the stage table in pipeline/stages/topology.py, as the faust app is: records
flow exactly as they do through the Kafka topics (telemetry → findings → health →
proposals/node-state → zone/policy → actions, fed back to health), each output handed to the
stage that reads its topic, breadth-first, like records travelling through topics. The whole
fleet is one partition. Outputs on FleetPulse's topics go to an `emit(topic_suffix, event)`
callback — the demo writes them to the lake; tests collect them.

A producer's batch record (pipeline/wire/batches.py) may be fed as one (`feed_batch`): its values
go through their stage in one `Stage.items` call, as the worker runs them, then their outputs
in order. Input is fed in event-time order, so nothing needs aligning. Stages mutate the states they
are given (stages/base.py); this driver keeps no snapshot: a stage that raises stops the run.
`stages` may be part of the table (a backtest runs the telemetry stage alone): an input whose
reader is not among them is counted (`ignored`) and dropped, and so are outputs.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from pipeline.config import Settings
from pipeline.decide import guard, health, policy
from pipeline.errors import DecodeError
from pipeline.model import DeadLetter, Event, RawRecord
from pipeline.stages import topology
from pipeline.stages import zone as zones
from pipeline.stages.base import Out, Refusal, Stage
from pipeline.stages.clock import CLOCKS, ClockName, Family, RobustClock
from pipeline.stages.keys import GUARD_KEY, record_key
from pipeline.stages.telemetry_state import TelemetryState, family_of
from pipeline.wire.codec import decode, encode
from pipeline.wire.internal import INTERNAL
from pipeline.wire.topics import TOPICS

Emit = Callable[[str, Event], None]
S = TypeVar("S")

_VALUE_BY_SUFFIX = {spec.suffix: spec.value for spec in TOPICS}
_SUFFIX_BY_VALUE = {spec.value: spec.suffix for spec in TOPICS}
# the counters' names, made once rather than per record
_IN_COUNT = {spec.value: f"in.{spec.value.__name__}" for spec in TOPICS}
_OUT_COUNT: dict[str, str] = {}
# the topics read from outside the pipeline (not written by any of its stages)
_INPUTS = {
    topic
    for topic in topology.READER
    if topic not in INTERNAL and not any(topic in stage.outputs for stage in topology.STAGES)
}


class _Part:
    """One stage's states, the fleet's clocks: stages.base.Part over dictionaries."""

    def __init__(self, runtime: EmbeddedRuntime, table: dict[str, Any]) -> None:
        self.runtime = runtime
        self.table = table

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    @property
    def wall_ms(self) -> int | None:
        return self.runtime._wall_ms() if self.runtime._wall_ms is not None else None

    def get(self, key: str, cls: type[S]) -> S | None:
        state: S | None = self.table.get(key)
        return state

    def put(self, key: str, state: Any) -> None:
        self.table[key] = state

    def clock(self, family: ClockName) -> RobustClock:
        return self.runtime.clocks[family]

    def observe(self, family: ClockName, key: str, ts: int) -> list[int]:
        return self.runtime.clocks[family].observe(key, ts)

    def keys(self, family: Family | None) -> list[str]:
        telemetry = self.runtime.telemetry
        return [
            key
            for key in sorted(telemetry)
            if family is None or family_of(telemetry[key]) == family
        ]

    def note_key(self, key: str, family: Family) -> None:
        pass  # the family of a key is read off its state (keys)

    def count(self, what: str) -> None:
        self.runtime.counts[what] += 1

    def failed(self, key: str, now_ms: int, exc: Exception) -> None:
        raise exc


class EmbeddedRuntime:
    """Feed events in event-time order; outputs are emitted as they are produced.

    The whole fleet is one stream: one robust clock per source family (clock.py), as a Kafka
    partition has. `wall_ms` (a callable) bounds how far ahead of the receiving process an
    event may be, where that makes sense (not for a replay of history)."""

    def __init__(
        self,
        settings: Settings,
        emit: Emit | None = None,
        wall_ms: Callable[[], int] | None = None,
        stages: tuple[Stage, ...] = topology.STAGES,
    ) -> None:
        self.settings = settings
        self._emit_to = emit
        self._wall_ms = wall_ms
        self.stages = stages
        self._reader = topology.reader_of(stages)
        self.tables: dict[str, dict[str, Any]] = {
            stage.table: {} for stage in topology.STAGES
        }
        self._parts = {s.name: _Part(self, self.tables[s.table]) for s in stages}
        self.counts: Counter[str] = Counter()
        self.clocks = {name: RobustClock(settings.clock) for name in CLOCKS}
        self._offset = 0  # pseudo offsets for dead letters of events fed as objects

    # the stages' states, by key
    @property
    def telemetry(self) -> dict[str, TelemetryState]:
        return self.tables["telemetry"]

    @property
    def health(self) -> dict[str, health.HealthState]:
        return self.tables["health"]

    @property
    def zones(self) -> dict[str, zones.ZoneState]:
        return self.tables["zones"]

    @property
    def policy(self) -> dict[str, policy.PolicyState]:
        return {k: v for k, v in self.tables["policy"].items() if k != GUARD_KEY}

    @property
    def guard(self) -> guard.GuardState | None:
        found: guard.GuardState | None = self.tables["policy"].get(GUARD_KEY)
        return found

    def feed(self, event: Event, key: str | None = None) -> None:
        """One input event, on the topic its type goes to; `key`: the record's key, checked
        like the worker checks it (None: the event's own)."""
        cls = type(event)
        self.counts[_IN_COUNT.get(cls) or f"in.{cls.__name__}"] += 1
        suffix = _SUFFIX_BY_VALUE.get(cls)
        if suffix not in _INPUTS:
            raise TypeError(f"the embedded runtime takes input events, got {type(event).__name__}")
        assert suffix is not None
        self._run([(suffix, record_key(event) if key is None else key, event)])

    def feed_batch(self, topic_suffix: str, items: Sequence[tuple[Event, str | None]]) -> None:
        """Values of one input topic that came together — a producer's batch record
        (pipeline/wire/batches.py) — as the worker runs them: through their stage in one
        `Stage.items` call, then each one's outputs, in order, breadth-first. (One at a time,
        `feed`, each value's outputs go through the stages before the next value is read.)
        `items`: (event, the record's key; None: the event's own)."""
        stage = self._reader.get(topic_suffix)
        if topic_suffix not in _INPUTS or stage is None:
            for event, key in items:
                self.feed(event, key)
            return
        keyed: list[tuple[Event, str]] = []
        for event, key in items:
            cls = type(event)
            self.counts[_IN_COUNT.get(cls) or f"in.{cls.__name__}"] += 1
            try:
                keyed.append((event, stage.key(event, record_key(event) if key is None else key)))
            except DecodeError as exc:
                self.counts[f"dead.{exc.reason}"] += 1
                self._dead_letter(topic_suffix, encode(event), self._offset, key, str(exc),
                                  exc.reason)  # fmt: skip
        queue: deque[tuple[str, str | None, Event | None]] = deque()
        results = stage.items(self._parts[stage.name], keyed) if keyed else []
        for (event, _), outs in zip(keyed, results, strict=True):
            self._route(outs, queue, (topic_suffix, event))
        self._drain(queue)

    def deliver(self, topic: str, key: str, event: Event) -> None:
        """An event put straight onto a topic the stages read, internal ones included (a
        backtest running the telemetry stage alone hands it the announcements)."""
        self._run([(topic, key, event)])

    def feed_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.feed(event)
        self.finish()

    def feed_raw(
        self,
        topic_suffix: str,
        raw: bytes | None,
        offset: int,
        key: str | None = None,
        content_type: str | None = None,
    ) -> None:
        """Decode like a Kafka consumer would (`content_type`: the record's header, None for
        JSON); bad records become dead letters, never errors. A tombstone on the compacted
        inventory topic is a target leaving it, as in the worker."""
        limit = self.settings.kafka.max_value_bytes
        self._offset = offset
        try:
            event = decode(raw, _VALUE_BY_SUFFIX[topic_suffix], limit, content_type)
        except DecodeError as exc:
            if exc.reason == "tombstone" and topic_suffix == "inventory" and key is not None:
                self.counts["tombstones"] += 1
                self._run([(topic_suffix, key, None)])
                return
            self.counts[f"dead.{exc.reason}"] += 1
            self._dead_letter(topic_suffix, raw, offset, key, str(exc), exc.reason)
            return
        self.feed(event, key)

    def reject(self, topic: str, raw: bytes, offset: int, error: str) -> None:
        """A record that never reached a topic (a bad line of a recording): a dead letter."""
        self._dead_letter(topic, raw, offset, None, error, "invalid")

    def finish(self) -> None:
        """End of input: every stage's end-of-input outputs (open utilization windows)."""
        for stage in self.stages:
            if stage.on_eof is not None:
                self._route(stage.on_eof(self._parts[stage.name]), deque())

    # --- routing --------------------------------------------------------------------------

    def _run(self, work: list[tuple[str, str | None, Event | None]]) -> None:
        # Breadth-first, like records travelling through topics: a stage's outputs are handled
        # after the inputs already queued, and actions flow back into the health machine.
        self._drain(deque(work))

    def _drain(self, queue: deque[tuple[str, str | None, Event | None]]) -> None:
        while queue:
            topic, key, event = queue.popleft()
            stage = self._reader.get(topic)
            if stage is None:  # its reader is not among this runtime's stages
                self.counts["ignored"] += 1
                continue
            try:
                state_key = stage.key(event, key)
            except DecodeError as exc:
                self.counts[f"dead.{exc.reason}"] += 1
                raw = None if event is None else encode(event)
                self._dead_letter(topic, raw, self._offset, key, str(exc), exc.reason)
                continue
            outs = stage.on_item(self._parts[stage.name], event, state_key)
            self._route(outs, queue, (topic, event))

    def _route(
        self,
        outs: list[Out],
        queue: deque[tuple[str, str | None, Event | None]],
        source: tuple[str, Event | None] | None = None,
    ) -> None:
        for out in outs:
            if isinstance(out.event, Refusal):
                assert source is not None  # only a record is refused
                topic, event = source
                assert event is not None
                self.counts[f"refused.{out.event.reason}"] += 1
                self._dead_letter(
                    topic, encode(event), self._offset, out.key, out.event.message, out.event.reason
                )
                continue
            if out.topic not in INTERNAL and out.event is not None:
                self._emit(out.topic, out.event)
            if out.topic in self._reader:
                queue.append((out.topic, out.key, out.event))

    def _dead_letter(
        self, suffix: str, raw: bytes | None, offset: int, key: str | None, error: str, reason: str
    ) -> None:
        ticked = [clock.ticked for clock in self.clocks.values() if clock.ticked is not None]
        record = RawRecord(topic=suffix, partition=0, offset=offset, key=key, value=raw)
        letter = DeadLetter.from_record(
            record, reason=reason, error=error, ts_ms=max(ticked, default=0)
        )
        self._emit("dlq", letter)

    def _emit(self, suffix: str, event: Event) -> None:
        name = _OUT_COUNT.get(suffix)
        if name is None:
            name = _OUT_COUNT[suffix] = f"out.{suffix}"
        self.counts[name] += 1
        if self._emit_to is not None:
            self._emit_to(suffix, event)


def collect(settings: Settings, events: Iterable[Event]) -> dict[str, list[Event]]:
    """Run events through the embedded pipeline and return every output by topic suffix."""
    outputs: dict[str, list[Event]] = {}
    runtime = EmbeddedRuntime(
        settings, lambda suffix, event: outputs.setdefault(suffix, []).append(event)
    )
    runtime.feed_all(events)
    return outputs
