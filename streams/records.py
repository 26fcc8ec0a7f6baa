"""From Kafka records to events, and from bad records to dead letters.

The app reads every topic as raw bytes (faust's `raw` serializer) so that a bad record is ours
to handle: it becomes a DeadLetter on fleet.dlq with its coordinates and bytes, and the stream
goes on. Nothing here talks to Kafka; the agents pass in what faust hands them.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from pipeline.errors import DecodeError
from pipeline.model import Event
from pipeline.wire.codec import MAX_VALUE_BYTES, content_type_of, decode

E = TypeVar("E", bound=Event)


class Record(Protocol):
    """The parts of a faust Message the runtime reads (faust.types.tuples.Message)."""

    topic: str
    partition: int
    offset: int
    timestamp: float
    key: bytes | None
    value: bytes | None


def decode_value(record: Record, expected: type[E], max_bytes: int = MAX_VALUE_BYTES) -> E:
    """The record's value as `expected`, in the format its `content-type` header names (JSON
    without one), or DecodeError naming what is wrong (tombstones too: reason "tombstone")."""
    content_type = content_type_of(getattr(record, "headers", None))
    return decode(record.value, expected, max_bytes, content_type)


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


def unexpected_error(stage: str, exc: BaseException) -> str:
    return f"unexpected error in the {stage} stage: {type(exc).__name__}: {exc}"
