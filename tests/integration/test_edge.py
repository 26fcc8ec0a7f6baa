"""Against the real broker: the Kafka edge (pipeline/wire/edge.py) commits only what its sink made
durable, dead-letters bad input with its coordinates and goes on, retries a failing flush
without committing, and replays what a stopped or refused run never committed."""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from pipeline.config import Settings
from pipeline.errors import DecodeError, SinkError
from pipeline.model import DeadLetter
from pipeline.wire.admin import create_topics
from pipeline.wire.codec import decode
from pipeline.wire.edge import Edge, EdgeOptions, Rejected, run_edge
from pipeline.wire.topics import topic_name


class ListSink:
    """Values starting with b"bad" are bad input; `failures` flushes fail before one works;
    values starting with b"refuse" are refused for good at flush time."""

    def __init__(self, failures: int = 0) -> None:
        self.pending: list[Any] = []
        self.durable: list[bytes] = []
        self.failures = failures
        self.flush_calls = 0
        self.marked: list[dict[tuple[str, int], int]] = []

    def add(self, record: Any) -> None:
        if record.value.startswith(b"bad"):
            raise DecodeError("$", "good bytes", repr(record.value[:10]))
        self.pending.append(record)

    def flush(self) -> Sequence[Rejected]:
        self.flush_calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise SinkError("store is away", reason="away")
        refused = [Rejected(r, "refused", "no thanks") for r in self.pending
                   if r.value.startswith(b"refuse")]
        self.durable += [r.value for r in self.pending if not r.value.startswith(b"refuse")]
        self.pending = []
        return refused

    def discard(self) -> None:
        self.pending = []

    def committed(self, positions: dict[tuple[str, int], int]) -> None:
        self.marked.append(dict(positions))


def _produce(settings: Settings, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    for i, value in enumerate(values):
        producer.send(topic, key=f"k{i}".encode(), value=value).get(timeout=30)
    producer.close()


def _committed(settings: Settings, topic: str, group: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        return sum(consumer.committed(tp) or 0 for tp in partitions)
    finally:
        consumer.close()


def _letters(settings: Settings, count: int) -> list[DeadLetter]:
    dlq = KafkaConsumer(topic_name(settings.kafka, "dlq"),
                        bootstrap_servers=settings.kafka.bootstrap, auto_offset_reset="earliest")
    letters: list[DeadLetter] = []
    deadline = time.monotonic() + 30
    while len(letters) < count and time.monotonic() < deadline:
        for records in dlq.poll(timeout_ms=500).values():
            letters += [decode(record.value, DeadLetter) for record in records]
    dlq.close()
    return letters


def _topic(settings: Settings) -> str:
    create_topics(settings.kafka)
    return topic_name(settings.kafka, "alerts")  # any topic of ours: raw bytes here


def test_commits_what_was_flushed_and_dead_letters_bad_input_with_its_coordinates(
    settings: Settings,
) -> None:
    topic = _topic(settings)
    good = [f"good-{i}".encode() for i in range(40)]
    _produce(settings, topic, [*good[:20], b"bad one", b"refuse me", *good[20:]])
    group, sink = f"edge-{uuid.uuid4().hex[:8]}", ListSink()
    stats = run_edge(settings, name="edge-test", topics=[topic], group_id=group, sink=sink,
                     stop=threading.Event(), options=EdgeOptions(max_records=7, idle_exit_s=5.0))
    assert sorted(sink.durable) == sorted(good)  # each once, none lost
    assert stats.records == 42 and stats.dead_letters == {"invalid": 1, "refused": 1}
    assert stats.commits >= 2 and stats.commit_lag == 0 and stats.flush_blocked == 0
    assert _committed(settings, topic, group) == 42
    assert sink.marked and sum(max(m.values()) for m in sink.marked[-1:]) > 0
    letters = sorted(_letters(settings, 2), key=lambda letter: letter.reason)
    assert [(letter.topic, letter.reason) for letter in letters] == [
        (topic, "invalid"), (topic, "refused")]
    assert base64.b64decode(letters[0].raw_b64) == b"bad one"
    assert "expected good bytes" in letters[0].error and letters[0].key == "k20"
    assert letters[1].error == "no thanks" and letters[1].ts > 1_700_000_000_000


def test_a_failing_flush_commits_nothing_and_is_retried_until_it_succeeds(
    settings: Settings,
) -> None:
    topic = _topic(settings)
    values = [f"v{i}".encode() for i in range(10)]
    _produce(settings, topic, values)
    group, sink = f"edge-{uuid.uuid4().hex[:8]}", ListSink(failures=3)
    options = EdgeOptions(max_records=100, max_interval_s=0.0, retry_initial_s=0.05,
                          retry_max_s=0.2, idle_exit_s=5.0)
    stats = run_edge(settings, name="edge-test", topics=[topic], group_id=group, sink=sink,
                     stop=threading.Event(), options=options)
    assert stats.flush_errors == {"away": 3} and stats.flush_blocked == 0
    assert sorted(sink.durable) == sorted(values)
    assert _committed(settings, topic, group) == 10


def test_what_was_never_flushed_is_replayed_by_the_next_run(settings: Settings) -> None:
    topic = _topic(settings)
    values = [f"v{i}".encode() for i in range(10)]
    _produce(settings, topic, values)
    group = f"edge-{uuid.uuid4().hex[:8]}"
    stop, broken = threading.Event(), ListSink(failures=10**6)
    seen: list[Edge] = []

    def stop_once_blocked() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (seen and seen[0].stats.flush_blocked):
            time.sleep(0.1)
        ready, why = seen[0].readiness()
        assert not ready and "blocked (away)" in why
        stop.set()

    watcher = threading.Thread(target=stop_once_blocked)
    watcher.start()
    options = EdgeOptions(max_interval_s=0.0, retry_initial_s=0.05, retry_max_s=0.2)
    run_edge(settings, name="edge-test", topics=[topic], group_id=group, sink=broken, stop=stop,
             options=options, on_start=seen.append)
    watcher.join()
    assert broken.durable == [] and _committed(settings, topic, group) == 0

    fixed = ListSink()
    run_edge(settings, name="edge-test", topics=[topic], group_id=group, sink=fixed,
             stop=threading.Event(), options=EdgeOptions(idle_exit_s=5.0))
    assert sorted(fixed.durable) == sorted(values)
    assert _committed(settings, topic, group) == 10


def test_readiness_says_starting_then_joined(settings: Settings) -> None:
    topic = _topic(settings)
    _produce(settings, topic, [b"one"])
    group = f"edge-{uuid.uuid4().hex[:8]}"
    edge = Edge(settings, name="edge-test", topics=[topic], group_id=group, sink=ListSink(),
                stop=threading.Event(), options=EdgeOptions(idle_exit_s=5.0))
    assert edge.readiness() == (False, "starting")
    answers: list[tuple[bool, str]] = []

    class Watching(ListSink):
        def flush(self) -> Sequence[Rejected]:
            answers.append(edge.readiness())
            return super().flush()

    edge.sink = Watching()
    edge.run()
    assert answers and answers[0] == (True, f"joined group {group}")


def test_partitions_given_away_are_flushed_and_committed_first(settings: Settings) -> None:
    topic = _topic(settings)
    values = [f"v{i}".encode() for i in range(60)]
    _produce(settings, topic, values)
    group = f"edge-{uuid.uuid4().hex[:8]}"
    slow = EdgeOptions(max_interval_s=600.0, max_records=10**6, session_timeout_s=10)
    first_sink, first_stop, edges = ListSink(), threading.Event(), []
    first = threading.Thread(target=run_edge, args=(settings,), kwargs=dict(
        name="edge-a", topics=[topic], group_id=group, sink=first_sink, stop=first_stop,
        options=slow, on_start=edges.append))
    first.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not edges or edges[0].stats.records < 60):
        time.sleep(0.1)
    assert edges[0].stats.records == 60 and first_sink.durable == []  # all held, none flushed
    # a second member joins: the first must flush and commit before it gives partitions away
    second_sink = ListSink()
    run_edge(settings, name="edge-b", topics=[topic], group_id=group, sink=second_sink,
             stop=threading.Event(), options=EdgeOptions(idle_exit_s=5.0))
    first_stop.set()
    first.join(timeout=60)
    assert sorted(first_sink.durable) == sorted(values)  # flushed on revoke
    assert second_sink.durable == []  # nothing was read twice
    assert _committed(settings, topic, group) == 60


def test_a_member_alone_joins_once_without_rebalancing_itself(settings: Settings) -> None:
    # kafka-python compares the partitions it assigned from with its newest metadata: joined
    # before a refresh that knew the subscription, it assigned from nothing, and its first
    # metadata refresh after the join rebalanced the group at once (pipeline/wire/edge.py)
    _topic(settings)
    topics = [topic_name(settings.kafka, s) for s in ("alerts", "actions", "findings", "dlq")]
    _produce(settings, topics[0], [b"one"])

    class Counting(ListSink):
        assignments = 0

        def assigned(self) -> None:
            Counting.assignments += 1

    edge = Edge(settings, name="edge-test", topics=topics, group_id=f"edge-{uuid.uuid4().hex[:8]}",
                sink=Counting(), stop=threading.Event(), options=EdgeOptions(idle_exit_s=6.0))
    edge.run()
    assert edge.sink.durable == [b"one"]  # type: ignore[attr-defined]
    assert Counting.assignments == 1
