"""From Kafka records to events, and from bad records to dead letters.

The app reads every topic as raw bytes (faust's `raw` serializer) so that a bad record is ours
to handle: it becomes a DeadLetter on fleet.dlq with its coordinates and bytes, and the stream
goes on. Nothing here talks to Kafka; the agents pass in what faust hands them.
"""

from __future__ import annotations

import base64
from typing import Protocol, TypeVar

from pipeline.codec import decode
from pipeline.errors import DecodeError
from pipeline.model import DeadLetter, Event

E = TypeVar("E", bound=Event)

_MAX_KEY = 256  # DeadLetter.key is ShortText
_MAX_ERROR = 4096  # DeadLetter.error is Text
_NO_TIMESTAMP_MS = 1_000_000_000_000  # the smallest TimestampMs: "the record had none"


class Record(Protocol):
    """The parts of a faust Message the runtime reads (faust.types.tuples.Message)."""

    topic: str
    partition: int
    offset: int
    timestamp: float
    key: bytes | None
    value: bytes | None


def decode_value(record: Record, expected: type[E]) -> E:
    """The record's value as `expected`, or DecodeError naming what is wrong (tombstones too)."""
    if record.value is None:
        raise DecodeError(field="$", expected="a JSON object", got="a null value (tombstone)")
    return decode(record.value, expected)


def key_text(record: Record) -> str | None:
    if record.key is None:
        return None
    return record.key.decode("utf-8", errors="replace")


def check_key(record: Record, expected: str, what: str) -> None:
    """Keys decide partitions, and partitions decide which worker holds a target's state: a
    record keyed by anything but its own node/slice/pool would split that state in two."""
    if record.key != expected.encode():
        raise DecodeError(
            field="key",
            expected=f"{expected!r} (the record's {what}; keys decide partitions)",
            got="no key" if record.key is None else repr(key_text(record)),
        )


def dead_letter(record: Record, error: str) -> DeadLetter:
    """A DeadLetter for `record`; its ts is the record's broker timestamp, so a replay of the
    same bad record produces the same letter."""
    key = key_text(record)
    return DeadLetter(
        ts=max(_NO_TIMESTAMP_MS, int(record.timestamp * 1000)),
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=None if key is None else key[:_MAX_KEY],
        error=error[:_MAX_ERROR],
        raw_b64=base64.b64encode(record.value or b"").decode("ascii"),
    )


def unexpected_error(stage: str, exc: BaseException) -> str:
    return f"unexpected error in the {stage} stage: {type(exc).__name__}: {exc}"
