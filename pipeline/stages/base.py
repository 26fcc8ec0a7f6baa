"""The contract between a stage and the driver that runs it (the embedded runtime, the faust app).

A stage (one module of this package each) names its input topics, the key its state is kept
under (checked against the record's key: keys decide partitions), its state table, and pure
functions over the state of one partition of its input:

- `on_item(part, event, key)`: one record; returns its outputs;
- `on_items(part, items)`: a batch of records of the partition, in order; returns their
  outputs in order. `Stage.items` runs it: the stage's own where it has one, else `on_item`
  for each. A driver hands a stage what it has read of a partition at once, and keeps one
  roll-back point per batch (see below);
- `on_time(part, family, boundaries)`: the partition's clock of a family crossed tick
  boundaries (only the telemetry stage has one, and calls it itself for records that move
  the clock; the Kafka driver also calls it for a quiet partition, see streams/clock.py);
- `on_eof(part)`: end of input (the embedded runtime, backtests; a stream never ends).

`Part` is what a driver gives a stage: the key states of the partition, its robust clocks
(clock.py), the settings and, where the driver has one, the wall clock.

State ownership, one rule: **stages mutate the state they are given** (and `put` it), and the
driver keeps the snapshot to roll back to: the Kafka driver keeps every key's last written
state as msgpack bytes (streams/context.py) and decodes it again after a failure; the embedded
runtime stops at the first error, so it keeps none. No stage copies its state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import msgspec

from pipeline.errors import DecodeError
from pipeline.model import Action, Event, Finding
from pipeline.stages.clock import FAMILIES, ClockName, Family, RobustClock, check_control
from pipeline.stages.keys import health_key, target_name
from pipeline.wire.internal import DEAD_LETTERS

S = TypeVar("S")


class Refusal(NamedTuple):
    """Why a record is not let in: `reason` for metrics, `message` for the dead letter."""

    reason: str  # "ahead", "behind", "late", "inventory_mismatch"
    message: str


class Out(NamedTuple):
    """One output: to `topic` (suffix or internal name) under `key`. A `Refusal` goes to the
    dead letters, built by the driver from the record it came from. None: a tombstone (only
    to an internal topic: a member left the inventory)."""

    topic: str
    key: str
    event: Event | Refusal | None


class Part(Protocol):
    """One partition of a stage's input, as the driver holds it."""

    @property
    def settings(self) -> Any: ...  # pipeline.config.Settings

    @property
    def wall_ms(self) -> int | None: ...  # the receiving process's clock, if it has one

    def get(self, key: str, cls: type[S]) -> S | None: ...

    def put(self, key: str, state: Any) -> None: ...

    def clock(self, family: ClockName) -> RobustClock: ...

    def observe(self, family: ClockName, key: str, ts: int) -> list[int]:
        """An accepted record of `key` at `ts` moves the family's clock: the boundaries to
        tick at (RobustClock.observe; the Kafka driver also notes when the partition last
        moved, streams/clock.py)."""
        ...

    def keys(self, family: Family | None) -> list[str]:
        """The partition's telemetry keys of `family` (None: all), sorted."""
        ...

    def note_key(self, key: str, family: Family) -> None: ...

    def count(self, what: str) -> None: ...  # "unknown_target", "impossible_values", ...

    def failed(self, key: str, now_ms: int, exc: Exception) -> None:
        """A staleness check raised: no record is to blame (log, count, roll back)."""
        ...


# One record of a batch: its event (None: a tombstone) and its state key (Stage.key's).
Item = tuple[Any, str]
OnItem = Callable[[Part, Any, str], list[Out]]
OnItems = Callable[[Part, Sequence[Item]], list[list[Out]]]
OnTime = Callable[[Part, Family, list[int]], list[Out]]
OnEof = Callable[[Part], list[Out]]
KeyOf = Callable[[Any, str | None], str]


@dataclass(frozen=True)
class Stage:
    name: str
    inputs: tuple[str, ...]
    aligned: tuple[str, ...]  # inputs put in event-time order while catching up (align.py)
    table: str
    key: KeyOf  # (event, record key) -> the state key, or DecodeError when the key is wrong
    on_item: OnItem
    outputs: tuple[str, ...]
    on_items: OnItems | None = None
    on_time: OnTime | None = None
    on_eof: OnEof | None = None
    # on_item depends only on the states it reads, the record and the settings: a driver may
    # replay it to rebuild a state (streams/context.py). The telemetry stage is not: it reads
    # the partition's clocks and the wall clock, which a replay would find moved on.
    replayable: bool = True

    def items(self, part: Part, items: Sequence[Item]) -> list[list[Out]]:
        """A batch of the partition's records, in order: each one's outputs."""
        if self.on_items is not None:
            return self.on_items(part, items)
        return [self.on_item(part, event, key) for event, key in items]


def expect_key(got: str | None, expected: str, what: str) -> str:
    """Keys decide partitions, and partitions decide which worker holds a target's state: a
    record keyed by anything but its own node/slice/pool would split that state in two."""
    if got != expected:
        raise DecodeError(
            field="key",
            expected=f"{expected!r} (the record's {what}; keys decide partitions)",
            got="no key" if got is None else repr(got),
        )
    return expected


def control_door(part: Part, event: Event, key: str) -> list[Out]:
    """A control record (inventory, node event, capacity event, policy release) passes the
    door too: one dated further ahead than clock.max_ahead_s of the receiving process's clock,
    or of the telemetry's clock where the stage sees it, is a dead letter (one dated 2286 would
    move the health machine's or a pool's time). [] when it may pass."""
    ts: int = getattr(event, "ts")  # noqa: B009 - every control record has one
    references = [part.clock(family).reference() for family in FAMILIES]
    verdict = check_control(
        ts, part.wall_ms, [r for r in references if r is not None], part.settings.clock
    )
    if verdict is None:
        return []
    part.count(f"control_{verdict.reason}")
    return [Out(DEAD_LETTERS, key, Refusal(verdict.reason, verdict.message))]


def finding_out(finding: Finding) -> Out:
    return Out("findings", health_key(finding), finding)


def action_out(action: Action) -> Out:
    return Out("actions", target_name(action.target), action)


def tag(event: Event) -> str:
    """The schema tag of an event, for a message naming what came instead of what was due."""
    return repr(type(event).__struct_config__.tag)


_ENCODER = msgspec.msgpack.Encoder()


def encode_state(state: Any) -> bytes:
    """States go into faust tables as msgpack (compact, and msgspec Structs round-trip)."""
    return _ENCODER.encode(state)


def decode_state(raw: bytes, cls: type[S]) -> S:
    return msgspec.msgpack.decode(raw, type=cls)
