"""The Kafka side of every actuator (and of the node watchers' sends).

`ActuatorSink` is an edge sink (pipeline/wire/edge.py): `add(record)` decodes one consumed record
(DecodeError for a bad value: dead-lettered) and starts it in its key's lane; the edge commits
only up to the first action whose outcome is not yet known and echoed. `run_actuator` drives
it with the shared runner, as the lake sink and alerts are driven.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pipeline.actuate.base import BaseActuator, RefusedError
from pipeline.config import Settings
from pipeline.errors import SinkError
from pipeline.model import Action
from pipeline.retry import Backoff
from pipeline.selfmetrics import Readiness
from pipeline.wire.codec import decode, encode
from pipeline.wire.edge import Edge, EdgeOptions, EdgeStats, Rejected
from pipeline.wire.kafka import STAY_CONNECTED, check_login, producer_kwargs
from pipeline.wire.topics import record_key, topic_name

log = logging.getLogger(__name__)
_SEND_TIMEOUT_S = 30
STALLED_AFTER_S = 30.0  # a target whose actions fail this long makes /readyz say so


@dataclass(frozen=True)
class Out:
    """One record to send: topic suffix, key, value (None: a tombstone)."""

    topic: str
    key: str
    value: bytes | None


class Producer:
    """acks=all sends, waited for: a batch returns only once the broker has it."""

    def __init__(self, settings: Settings, client_id: str) -> None:
        from kafka import KafkaProducer

        check_login(settings.kafka)
        self.settings = settings
        self._producer = KafkaProducer(**producer_kwargs(settings.kafka), **STAY_CONNECTED,
                                       client_id=client_id,
                                       acks="all", linger_ms=5)  # fmt: skip

    def send(self, outs: Sequence[Out]) -> None:
        from kafka.errors import KafkaError

        futures = [
            self._producer.send(topic_name(self.settings.kafka, out.topic),
                                key=out.key.encode(), value=out.value)
            for out in outs
        ]
        try:
            for future in futures:
                future.get(timeout=_SEND_TIMEOUT_S)
        except KafkaError as exc:
            raise SinkError(f"Kafka did not acknowledge {len(outs)} records: {exc}") from exc

    def close(self) -> None:
        self._producer.close(timeout=_SEND_TIMEOUT_S)


@dataclass
class _Job:
    record: Any
    action: Action
    where: tuple[str, int]  # (topic, partition)
    generation: int
    tries: int = 0


class ActuatorSink:
    """fleet.actions records → the actuator, in the edge-sink shape (pipeline/wire/edge.py), with
    no head-of-line blocking.

    `add` decodes (DecodeError for a bad value: dead-lettered) and hands the action to the
    lane of its key (cluster/target): one worker per key at a time, so a target's actions
    keep their order while a drain that waits for minutes (on a PodDisruptionBudget, on Slurm
    jobs) holds up only its own node. A job is finished once its echo is acknowledged by the
    broker; `unsettled()` names the first offset per partition whose action is not, and the
    edge commits only up to there, so a crash replays every action whose outcome was not
    known (the node records what was done, so a replay changes nothing twice). The runtime
    failing (SinkError) is
    retried in the lane with backoff; a request it refuses for good (RefusedError: a 400/422,
    a name scontrol cannot take) is tried <section>.api_rejections times, then returned by
    `flush` to be dead-lettered; the actions behind it go on.
    """

    def __init__(self, actuator: BaseActuator[Any], send: Callable[[Sequence[Out]], None],
                 max_bytes: int, *, stalled_after_s: float = STALLED_AFTER_S) -> None:  # fmt: skip
        self.actuator, self.send, self.max_bytes = actuator, send, max_bytes
        self.stalled_after_s = stalled_after_s
        self.settings = actuator.settings
        self._lock = threading.Lock()
        self._lanes: dict[bytes | None, deque[_Job]] = {}  # key -> jobs, the first running
        self._open: dict[tuple[str, int], set[int]] = {}  # offsets not finished, per partition
        self._rejected: list[Rejected] = []
        self._failing: dict[bytes | None, tuple[float, str]] = {}  # key -> (since, last error)
        self._generation = 0
        self._closing = threading.Event()
        self._pool = ThreadPoolExecutor(self.settings.drain_workers, "actuator-lane")

    def add(self, record: Any) -> None:
        action = decode(record.value, Action, self.max_bytes)
        where = (record.topic, record.partition)
        with self._lock:
            job = _Job(record, action, where, self._generation)
            self._open.setdefault(where, set()).add(record.offset)
            lane = self._lanes.setdefault(record.key, deque())
            lane.append(job)
            if len(lane) == 1:  # no worker on this key yet
                self._pool.submit(self._run_lane, record.key)

    def flush(self) -> list[Rejected]:
        """What the runtime refused for good (dead-lettered before the commit). Never
        waits for actions in flight: the commit stops at them (`unsettled`)."""
        with self._lock:
            rejected, self._rejected = self._rejected, []
        return rejected

    def unsettled(self) -> dict[tuple[str, int], int]:
        """Per partition, the offset of the first action not finished: the commit stops there."""
        with self._lock:
            return {where: min(offsets) for where, offsets in self._open.items() if offsets}

    def wait_settled(self, timeout_s: float = 5.0) -> None:
        """On the way out: a moment for actions under way (a drain may take far longer: what
        is not finished then is carried out again after the restart)."""
        deadline = time.monotonic() + timeout_s
        while self.busy() and time.monotonic() < deadline:
            time.sleep(0.05)

    def busy(self) -> bool:
        with self._lock:
            return any(self._open.values())

    def discard(self) -> None:
        """The edge gives up what it holds (it is replayed): jobs not started are dropped,
        the ones running finish but no longer hold back a commit."""
        with self._lock:
            self._generation += 1
            self._open = {}
            for lane in self._lanes.values():
                while len(lane) > 1:
                    lane.pop()

    def close(self) -> None:
        """Stop retrying and taking jobs, and break off drains under way: what is not finished
        is replayed after a restart."""
        self._closing.set()
        self.actuator.stopping.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def readiness(self) -> tuple[bool, str]:
        """Not ready while some target's actions have failed against the runtime (or
        Kafka) for longer than `stalled_after_s`: they are retried, but nobody is acting."""
        now = time.monotonic()
        with self._lock:
            stalled = {k: v for k, v in self._failing.items() if now - v[0] > self.stalled_after_s}
        if not stalled:
            return True, "no target stalled"
        since, error = min(stalled.values())
        return False, (f"{len(stalled)} targets' actions failing for {now - since:.0f} s, "
                       f"retried: {error}"[:500])

    # --- a lane: one key's actions, in order ---------------------------------------------

    def _run_lane(self, key: bytes | None) -> None:
        while not self._closing.is_set():
            with self._lock:
                lane = self._lanes.get(key)
                if not lane:
                    self._lanes.pop(key, None)
                    return
                job = lane[0]
            if job.generation == self._generation:
                self._carry_out(job, None if key is None else key.decode(errors="replace"))
            with self._lock:
                lane.popleft()
                if job.generation == self._generation:
                    self._open.get(job.where, set()).discard(job.record.offset)

    def _carry_out(self, job: _Job, key: str | None) -> None:
        """The action done and its echo acknowledged, or given up (dead letter), or closing."""
        backoff = Backoff(0.25, 5.0)
        while not self._closing.is_set():
            self.actuator.count("in_flight")
            try:
                echo = self.actuator.handle(job.action, key)
                if echo is not None:
                    self.send([Out("events.node", record_key(echo), encode(echo))])
                with self._lock:
                    self._failing.pop(job.record.key, None)
                return
            except RefusedError as exc:
                job.tries += 1
                if job.tries >= self.settings.api_rejections:
                    self._give_up(job, str(exc))
                    return
                log.warning("%s: the runtime refused it (%d of %d): %s", job.action.action_id,
                            job.tries, self.settings.api_rejections, exc)  # fmt: skip
            except SinkError as exc:  # unreachable, 5xx, Kafka: retried (the node recalls it)
                self.actuator.count("api_errors")
                self._failed(job, str(exc))
                log.warning("%s %s: %s; retrying", job.action.action_id,
                            job.action.target.name, exc)  # fmt: skip
            except Exception as exc:  # a bug: the lane must not die with its key's actions
                self._failed(job, f"{type(exc).__name__}: {exc}")
                log.exception("%s %s: unexpected; retrying", job.action.action_id,
                              job.action.target.name)  # fmt: skip
            finally:
                self.actuator.count("in_flight", -1)
            self._closing.wait(backoff.next_delay())

    def _failed(self, job: _Job, error: str) -> None:
        with self._lock:
            since = self._failing.get(job.record.key, (time.monotonic(), ""))[0]
            self._failing[job.record.key] = (since, error[:300])

    def _give_up(self, job: _Job, error: str) -> None:
        self.actuator.count_refusal("api_rejected")
        log.error("%s %s %s: dead-lettered after %d tries: %s", job.action.action_id,
                  job.action.kind, job.action.target.name, job.tries, error)  # fmt: skip
        with self._lock:
            self._rejected.append(Rejected(job.record, "api_rejected", error))


class _ActuatorEdge(Edge):
    """The edge (which commits a `Settles` sink only up to its first unfinished record), idle
    only once no action is under way: an idle exit must not walk away from a drain."""

    sink: ActuatorSink

    def _caught_up(self) -> bool:
        return not self.sink.busy() and super()._caught_up()


def run_actuator(
    settings: Settings,
    group_id: str,
    sink: ActuatorSink,
    *,
    stop: threading.Event,
    idle_exit_s: float | None = None,
    readiness: Readiness | None = None,
    stats: EdgeStats | None = None,
) -> EdgeStats:
    """fleet.actions through the edge runner (pipeline/wire/edge.py) into the actuator's lanes (one
    per key: per-key order, no key waits for another); offsets committed up to the first
    action not finished, after its echo is acknowledged; bad values and actions the runtime
    refuses for good go to fleet.dlq. The loop keeps polling while drains run, so the group
    never takes a long drain for a stuck member."""
    options = EdgeOptions(max_records=50, max_interval_s=0.0, idle_exit_s=idle_exit_s)

    def started(edge: Any) -> None:
        if readiness is not None:
            readiness.check = lambda: _both(edge.readiness(), sink.readiness())

    topics = [topic_name(settings.kafka, "actions")]
    edge = _ActuatorEdge(settings, name="actuator", topics=topics, group_id=group_id, sink=sink,
                         stop=stop, options=options, stats=stats)  # fmt: skip
    started(edge)
    try:
        return edge.run()
    finally:
        sink.close()


def _both(first: tuple[bool, str], second: tuple[bool, str]) -> tuple[bool, str]:
    return first if not first[0] else second if not second[0] else (True, first[1])
