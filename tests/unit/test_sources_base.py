"""Checkpoints, backoff and the poll → publish → commit loop every ingest adapter runs."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from pipeline.errors import DecodeError, SourceError
from pipeline.model import DeadLetter, Event, XidEvent
from pipeline.retry import Backoff
from pipeline.sources.base import (
    BadRecord,
    Batch,
    load_checkpoint,
    run_source,
    save_checkpoint,
)
from pipeline.sources.publish import StdoutPublisher, dead_letter
from pipeline.wire.codec import decode
from pipeline.wire.topics import record_key as event_key


class Position(msgspec.Struct, frozen=True):
    n: int


XID = XidEvent(
    ts=1_764_424_804_211,
    cluster="c1",
    node="gpu-node-1",
    pool="a3",
    zone="us-a",
    pci_bus_id="0000:53:00",
    xid=79,
    message="NVRM: Xid (PCI:0000:53:00): 79",
    source="kernel_log",
)


def test_checkpoint_round_trip_and_atomic_replace(tmp_path: Path) -> None:
    path = tmp_path / "state" / "source.json"
    assert load_checkpoint(path, Position) is None
    save_checkpoint(path, Position(3))
    save_checkpoint(path, Position(4))
    assert load_checkpoint(path, Position) == Position(4)
    assert [p.name for p in path.parent.iterdir()] == ["source.json"]  # no temporary left


def test_unreadable_checkpoint_stops_the_source(tmp_path: Path) -> None:
    path = tmp_path / "source.json"
    path.write_text('{"n": "three"}')
    with pytest.raises(SourceError, match="unreadable"):
        load_checkpoint(path, Position)


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(initial=0.5, maximum=4.0)
    delays = [backoff.next_delay() for _ in range(6)]
    # equal jitter: each delay in [d/2, d] for d = 0.5, 1, 2, 4, 4, 4
    for delay, ceiling in zip(delays, [0.5, 1.0, 2.0, 4.0, 4.0, 4.0], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    backoff.reset()
    assert 0.25 <= backoff.next_delay() <= 0.5


class FlakySource:
    """Fails `failures` times, then yields batches 1, 2, …; records commits."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.polls = 0
        self.committed: list[int] = []

    def poll(self) -> Batch:
        if self.failures:
            self.failures -= 1
            raise SourceError("endpoint down")
        self.polls += 1
        bad = BadRecord(b"junk", DecodeError(field="line", expected="an XID line", got="junk"))
        return Batch([XID], [bad], Position(self.polls))

    def commit(self, position: msgspec.Struct | None) -> None:
        assert isinstance(position, Position)
        self.committed.append(position.n)

    def close(self) -> None:
        pass


class Recorder:
    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.batches: list[tuple[list[Event], list[BadRecord]]] = []

    def publish(self, source: str, events: Sequence[Event], bad: Sequence[BadRecord]) -> None:
        if self.fail_first:
            self.fail_first -= 1
            raise SourceError("Kafka did not acknowledge")
        self.batches.append((list(events), list(bad)))

    def close(self) -> None:
        pass


def test_loop_backs_off_while_failing_and_commits_after_publish() -> None:
    source, publisher, sleeps = FlakySource(failures=3), Recorder(), []
    stats = run_source(
        source,
        publisher,
        interval_s=0.0,
        backoff=Backoff(1.0, 60.0),
        max_polls=2,
        sleep=sleeps.append,
    )
    for delay, ceiling in zip(sleeps[:3], [1.0, 2.0, 4.0], strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert (stats.polls, stats.events, stats.bad, stats.errors) == (2, 2, 2, 3)
    assert source.committed == [1, 2] and len(publisher.batches) == 2


def test_unacknowledged_batch_is_not_committed() -> None:
    source, publisher = FlakySource(failures=0), Recorder(fail_first=1)
    run_source(
        source,
        publisher,
        interval_s=0.0,
        backoff=Backoff(1.0, 1.0),
        max_polls=1,
        sleep=lambda _: None,
    )
    # the first batch was polled but not acknowledged: no commit for it
    assert source.committed == [2]


def test_a_bounded_loop_gives_up_with_the_last_error() -> None:
    source, sleeps = FlakySource(failures=10), []
    with pytest.raises(SourceError, match="gave up after 3 failed attempts: endpoint down"):
        run_source(source, Recorder(), interval_s=0.0, backoff=Backoff(1.0, 60.0), max_polls=1,
                   sleep=sleeps.append, max_failures=3)
    assert len(sleeps) == 2 and source.failures == 7  # three tries, two waits between them


def test_keys_and_dead_letters() -> None:
    assert event_key(XID) == "c1/gpu-node-1"  # node names repeat across clusters
    bad = BadRecord(b"NVRM: Xid (PCI:zz)", DecodeError(field="line", expected="x", got="y"))
    letter = dead_letter("xid", bad, now_ms=1_764_424_900_000)
    assert (letter.topic, letter.partition, letter.offset) == ("source.xid", -1, -1)
    assert base64.b64decode(letter.raw_b64) == b"NVRM: Xid (PCI:zz)"
    assert "expected x, got y" in letter.error
    out = io.StringIO()
    StdoutPublisher(out).publish("xid", [XID], [bad])
    first, second = out.getvalue().splitlines()
    assert decode(first.encode(), XidEvent) == XID
    assert json.loads(second)["schema"] == "dead_letter/2"
    assert decode(second.encode(), DeadLetter).topic == "source.xid"
