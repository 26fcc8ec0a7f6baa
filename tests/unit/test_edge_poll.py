"""The edge loop (pipeline/wire/edge.py) outlives a broker that drops: kafka-python 3 can raise a
lost connection out of `poll` while it looks for the group coordinator again (seen in the
broker-restart scenario: the lake sink exited). The real broker case is
tests/faults/test_infra_broker_restart.py; here the client's error is raised on cue."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kafka.errors import KafkaConnectionError, UnsupportedVersionError

from pipeline.config import load_settings
from pipeline.wire.edge import Edge


class Sink:
    def add(self, record: Any) -> None:
        self.added = getattr(self, "added", 0) + 1

    def flush(self) -> None:
        return None


class Consumer:
    """poll raises each of `errors` in turn, then returns nothing; stops the loop after
    `polls` polls."""

    def __init__(self, errors: list[Exception], stop: threading.Event, polls: int) -> None:
        self.errors, self.stop, self.polls = errors, stop, polls

    def poll(self, timeout_ms: int) -> dict[Any, list[Any]]:
        self.polls -= 1
        if self.polls <= 0:
            self.stop.set()
        if self.errors:
            raise self.errors.pop(0)
        return {}

    def assignment(self) -> set[Any]:
        return set()


def _edge(errors: list[Exception], polls: int) -> tuple[Edge, Consumer]:
    stop = threading.Event()
    edge = Edge(load_settings(environ={}), name="test", topics=["t"], group_id="g",
                sink=Sink(), stop=stop)
    consumer = Consumer(errors, stop, polls)
    edge._consumer = consumer
    return edge, consumer


def test_a_lost_connection_in_poll_is_counted_and_the_loop_goes_on() -> None:
    lost = KafkaConnectionError("111 ECONNREFUSED")
    edge, consumer = _edge([lost, lost], polls=4)
    edge._loop()
    assert edge.stats.poll_errors == 2
    assert consumer.polls == 0  # it polled on after both errors


def test_an_error_that_retrying_cannot_mend_still_stops_the_loop() -> None:
    edge, _ = _edge([UnsupportedVersionError("no")], polls=4)
    with pytest.raises(UnsupportedVersionError):
        edge._loop()
    assert edge.stats.poll_errors == 0
