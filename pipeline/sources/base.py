"""What every ingest adapter shares: a poll result, checkpoints and the run loop (its backoff
is pipeline.retry's, re-exported here as `Backoff`).

An adapter is a pure parser plus a `Source`: `poll()` reads from the endpoint from the last
committed position and returns the events, the records it could not parse and the position
after them; the loop publishes both and only then calls `commit(position)`, which persists it.
A crash between publish and commit re-reads the same window: at-least-once, and the
deterministic event content makes the replay harmless downstream.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec

from pipeline.errors import BrokerUnavailableError, DecodeError, FleetPulseError, SourceError
from pipeline.model import Event
from pipeline.retry import Backoff
from pipeline.wire.codec import decode, encode

log = logging.getLogger(__name__)
S = TypeVar("S", bound=msgspec.Struct)
E = TypeVar("E", bound=Event)


def validated(event: E) -> E:
    """The event checked against its schema's constraints (constructing a Struct does not
    check them; decoding does), so a bad value is a dead letter here, not in every consumer."""
    return decode(encode(event), type(event))


@dataclass(frozen=True)
class BadRecord:
    """An input the parser rejected: the raw text (for the dead letter) and why."""

    raw: bytes
    error: DecodeError


@dataclass
class Parsed:
    """What a pure parser returns: good events and rejected inputs, in input order."""

    events: list[Event] = field(default_factory=list)
    bad: list[BadRecord] = field(default_factory=list)

    def extend(self, other: Parsed) -> None:
        self.events.extend(other.events)
        self.bad.extend(other.bad)


def add_validated(parsed: Parsed, make: Callable[[], Event], raw: str) -> bool:
    """Build an event from what an endpoint said (`make`) and add it to `parsed` validated; a
    bad value (a name that is not one is refused as the struct is built) becomes a BadRecord
    of `raw`, a few words saying what it was built from. False then."""
    try:
        parsed.events.append(validated(make()))
    except DecodeError as exc:
        parsed.bad.append(BadRecord(raw.encode(), exc))
        return False
    return True


@dataclass(frozen=True)
class Batch:
    """One poll: what to publish, and the position to commit once it is published."""

    events: Sequence[Event]
    bad: Sequence[BadRecord]
    position: msgspec.Struct | None


class Source(Protocol):
    """An ingest adapter's I/O side."""

    name: str

    def poll(self) -> Batch: ...

    def commit(self, position: msgspec.Struct | None) -> None: ...

    def close(self) -> None: ...


class Publisher(Protocol):
    """Where a batch goes; `publish` returns only once every record is acknowledged."""

    def publish(self, source: str, events: Sequence[Event], bad: Sequence[BadRecord]) -> None: ...

    def close(self) -> None: ...


# --- checkpoints ----------------------------------------------------------------------------


def load_checkpoint(path: Path, kind: type[S]) -> S | None:
    """The position saved at `path`, or None when there is none yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.DecodeError as exc:
        # A checkpoint we cannot read must not silently restart from scratch (a flood of
        # duplicates) nor from "now" (a gap): stop and let a person look.
        msg = f"checkpoint {path} is unreadable ({exc}); move it away to start over"
        raise SourceError(msg) from exc


def save_checkpoint(path: Path, position: msgspec.Struct) -> None:
    """Write atomically: a temporary file in the same directory, fsync, rename over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(msgspec.json.encode(position))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- the loop -------------------------------------------------------------------------------


@dataclass
class LoopStats:
    polls: int = 0
    events: int = 0
    bad: int = 0
    errors: int = 0


# A batch Kafka did not take is retried at least this often, however long the endpoint's
# backoff has grown: the adapter is back within seconds of the broker
BROKER_RETRY_MAX_S = 5.0
# Errors worth retrying: the endpoint or the network. A programming error still crashes.
RETRYABLE: tuple[type[BaseException], ...] = (FleetPulseError, OSError, ConnectionError)


def run_source(
    source: Source,
    publisher: Publisher,
    *,
    interval_s: float,
    backoff: Backoff,
    stop: threading.Event | None = None,
    max_polls: int | None = None,
    retryable: tuple[type[BaseException], ...] = RETRYABLE,
    sleep: Callable[[float], Any] | None = None,
    stats: LoopStats | None = None,
    max_failures: int | None = None,
) -> LoopStats:
    """Poll, publish, commit, sleep; back off exponentially while the endpoint fails.

    Stops when `stop` is set or after `max_polls` successful polls. `stats` (updated as it
    goes) lets a caller serve them as self-metrics while the loop runs. With `max_failures`,
    that many failures in a row raise SourceError instead of retrying on: a one-off run
    (`ingest --once`) must end and say why, where a daemon keeps waiting for its endpoint.
    """
    stop = stop or threading.Event()
    wait = sleep or stop.wait
    stats = LoopStats() if stats is None else stats
    while not stop.is_set() and (max_polls is None or stats.polls < max_polls):
        started = time.monotonic()
        try:
            batch = source.poll()
            publisher.publish(source.name, batch.events, batch.bad)
            source.commit(batch.position)
        except retryable as exc:
            stats.errors += 1
            if max_failures is not None and backoff.failures + 1 >= max_failures:
                msg = f"{source.name}: gave up after {max_failures} failed attempts: {exc}"
                raise SourceError(msg) from exc
            delay = backoff.next_delay()
            if isinstance(exc, BrokerUnavailableError):
                delay = min(delay, BROKER_RETRY_MAX_S)
            log.warning("%s: %s; retrying in %.1f s", source.name, exc, delay)
            wait(delay)
            continue
        backoff.reset()
        stats.polls += 1
        stats.events += len(batch.events)
        stats.bad += len(batch.bad)
        if max_polls is not None and stats.polls >= max_polls:
            break
        wait(max(0.0, interval_s - (time.monotonic() - started)))
    return stats
