"""The real broker, for benchmarks: private topics, producing, a do-nothing consumer, a worker.

Every benchmark run gets its own topic prefix (`bench-<name>-<random>`) and worker group, so
it never reads another run's records or disturbs a developer's topics, and deletes what it
created when it is done. The broker itself is whatever `deploy/with-services.sh` started.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

import msgspec
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from bench.common import proc_cpu_seconds
from pipeline.config import Settings, load_settings
from pipeline.model import Event
from pipeline.sim.output import topic_for
from pipeline.wire import codec
from pipeline.wire.admin import create_topics
from pipeline.wire.batches import PRODUCER_BATCHED, group_by_partition
from pipeline.wire.batches import headers as batch_headers
from pipeline.wire.kafka import client_kwargs
from pipeline.wire.topics import record_key, topic_name


class Record(NamedTuple):
    topic: str
    key: str
    value: bytes
    content_type: str  # the record's content-type header (pipeline/wire/codec.py)


def bench_settings(name: str) -> Settings:
    """Settings (file and environment, as `make bench` gives them) with a private prefix."""
    settings = load_settings()
    prefix = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    kafka = msgspec.structs.replace(settings.kafka, topic_prefix=prefix)
    return msgspec.structs.replace(settings, kafka=kafka)


def records(settings: Settings, events: Iterable[Event]) -> list[Record]:
    """Events as the ingest adapters would write them: topic, key, encoded value (in
    `kafka.telemetry_format`) and its content type."""
    fmt = settings.kafka.telemetry_format
    return [
        Record(topic_for(settings.kafka, e), record_key(e), *codec.encode_as(e, fmt))
        for e in events
    ]


def reachable(settings: Settings) -> str | None:
    """None when the broker answers, else why not (benchmarks then skip the Kafka parts)."""
    try:
        admin = KafkaAdminClient(
            **client_kwargs(settings.kafka), request_timeout_ms=5000
        )
    except Exception as exc:  # any client error means: no broker to measure against
        return f"no Kafka broker at {settings.kafka.bootstrap}: {exc}"
    admin.close()
    return None


@contextlib.contextmanager
def private_topics(settings: Settings) -> Iterator[None]:
    """Create the FleetPulse topics under the settings' prefix; delete every topic and group
    the run made (including the worker's changelogs and internal topics) afterwards."""
    create_topics(settings.kafka)
    try:
        yield
    finally:
        delete_prefixed(settings)


def delete_prefixed(settings: Settings) -> None:
    prefix = settings.kafka.topic_prefix
    admin = KafkaAdminClient(**client_kwargs(settings.kafka))
    try:
        doomed = [t for t in admin.list_topics() if t.startswith(prefix)]
        if doomed:
            with contextlib.suppress(Exception):  # best effort: the run is over either way
                admin.delete_topics(doomed, timeout_ms=30_000)
        groups = [g["group_id"] for g in admin.list_groups()
                  if str(g.get("group_id", "")).startswith(prefix)]
        if groups:
            with contextlib.suppress(Exception):
                admin.delete_groups(groups)
    finally:
        admin.close()


def set_log_append_time(settings: Settings, suffixes: Iterable[str]) -> None:
    """Make the broker stamp these topics' records with its own clock when it appends them,
    so a latency is two broker timestamps apart, whatever the producers' clocks say."""
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = KafkaAdminClient(**client_kwargs(settings.kafka))
    try:
        admin.alter_configs([
            ConfigResource(ConfigResourceType.TOPIC, topic_name(settings.kafka, suffix),
                           configs={"message.timestamp.type": "LogAppendTime"})
            for suffix in suffixes
        ])
    finally:
        admin.close()


def producer(settings: Settings, linger_ms: int = 20) -> KafkaProducer:
    return KafkaProducer(
        **client_kwargs(settings.kafka),
        acks="all",
        linger_ms=linger_ms,
        batch_size=512 * 1024,
        max_request_size=8 * 1024 * 1024,
    )


def produce(settings: Settings, batch: list[Record], batched: bool = False) -> None:
    """Send every record and wait until the broker has acknowledged all of them. `batched`:
    the telemetry as batch records (`wire_records`)."""
    kafka = producer(settings)
    try:
        futures = [
            kafka.send(t, key=k.encode(), value=v, headers=headers, partition=p)
            for t, k, v, headers, p in wire_records(settings, batch, batched)
        ]
        kafka.flush()
        for future in futures:
            future.get(timeout=60)
    finally:
        kafka.close()


def wire_records(
    settings: Settings, batch: list[Record], batched: bool
) -> Iterator[tuple[str, str, bytes, list[tuple[str, bytes]], int | None]]:
    """(topic, key, value, headers, partition) to send. `batched`: each run of telemetry
    records of one topic (a scrape: the simulator writes a tick's records topic by topic) goes
    as batch records, one per partition, as FleetPulse's producers write it by default
    (`kafka.telemetry_batch`; pipeline/wire/batches.py); else a record each."""
    prefix = settings.kafka.topic_prefix + "."
    for topic, run in itertools.groupby(batch, key=lambda r: r.topic):
        if not batched or topic.removeprefix(prefix) not in PRODUCER_BATCHED:
            yield from ((t, k, v, codec.record_headers(c), None) for t, k, v, c in run)
            continue
        values = [(k, c, v) for _, k, v, c in run]
        for partition, key, packed in group_by_partition(values, settings.kafka.partitions):
            yield topic, key, packed, batch_headers(), partition


def end_offsets(settings: Settings, topics: Iterable[str]) -> dict[TopicPartition, int]:
    consumer = KafkaConsumer(**client_kwargs(settings.kafka))
    try:
        partitions = [
            TopicPartition(t, p) for t in sorted(set(topics))
            for p in sorted(consumer.partitions_for_topic(t) or ())
        ]
        ends: dict[TopicPartition, int] = consumer.end_offsets(partitions)
        return ends
    finally:
        consumer.close()


# --- the limit: the worker's own client library, consuming and doing nothing ----------------


def consume_nothing(settings: Settings, ends: dict[TopicPartition, int],
                    each: Callable[[str, bytes, Any], object] | None = None,
                    ) -> tuple[float, float]:
    """aiokafka (the client under faust) reading every record of `ends`' partitions from the
    start, doing nothing with them (or only `each(topic, value, headers)`); returns (wall s, CPU s)
    for the reading alone."""
    return asyncio.run(_consume_nothing(settings, ends, each))


async def _consume_nothing(settings: Settings, ends: dict[TopicPartition, int],
                           each: Callable[[str, bytes, Any], object] | None,
                           ) -> tuple[float, float]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioPartition

    # client defaults, as faust leaves them; no group: partitions are assigned by hand
    consumer = AIOKafkaConsumer(**client_kwargs(settings.kafka, "aiokafka"), group_id=None,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [AioPartition(tp.topic, tp.partition) for tp in ends]
        total = sum(ends.values())
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        for tp in partitions:  # connections up and start offsets known before the clock runs
            await consumer.position(tp)
        wall, cpu = time.perf_counter(), time.process_time()
        seen = 0
        while seen < total:
            batches = await consumer.getmany(timeout_ms=1000)
            for batch in batches.values():
                seen += len(batch)
                if each is not None:
                    for record in batch:
                        each(record.topic, record.value, record.headers)
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await consumer.stop()


# --- the worker: `fleetpulse worker` as its own process --------------------------------------


@dataclass
class Worker:
    """One `python -m pipeline.cli worker` process on the bench's private topics."""

    settings: Settings
    workdir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    # the command line; default: the worker itself (a profiler may wrap it)
    command: list[str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def group(self) -> str:
        return self.settings.worker.group_id or f"{self.settings.kafka.topic_prefix}-worker"

    @property
    def log_path(self) -> Path:
        return self.workdir / "worker.log"

    def start(self) -> Worker:
        self.workdir.mkdir(parents=True, exist_ok=True)
        k = self.settings.kafka
        env = {
            **os.environ,
            "FLEETPULSE_KAFKA__BOOTSTRAP": k.bootstrap,
            "FLEETPULSE_KAFKA__TOPIC_PREFIX": k.topic_prefix,
            "FLEETPULSE_KAFKA__PARTITIONS": str(k.partitions),
            "FLEETPULSE_METRICS__PORT": "0",
            "FLEETPULSE_WORKER__DATADIR": str(self.workdir / "data"),
            "FLEETPULSE_WORKER__GROUP_ID": self.group,
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        self._log = self.log_path.open("ab")
        command = self.command or [
            sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", "warning"]
        self.proc = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_assigned(self, timeout: float) -> None:
        """Until the worker says it owns partitions (startup, group join and recovery done)."""
        pattern = re.compile(r"^fleetpulse worker: assigned (?!nothing)", re.M)
        self._poll(lambda: pattern.search(self.output()) is not None, timeout, "an assignment")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return proc_cpu_seconds(self.proc.pid)

    def committed(self, admin: KafkaAdminClient, partitions: Iterable[TopicPartition]) -> int:
        """Records of `partitions` whose offsets the worker has committed (it commits only
        past records whose outputs the broker acknowledged)."""
        offsets: dict[TopicPartition, Any] = admin.list_group_offsets(self.group).get(
            self.group, {})
        return sum(max(offsets[tp].offset, 0) for tp in partitions if tp in offsets)

    def _poll(self, done: Any, timeout: float, what: str, every: float = 0.1) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the worker exited ({self.proc.returncode}): {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout:.0f} s: {self.tail()}")
            time.sleep(every)

    def stop(self, timeout: float = 60) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


def drain(worker: Worker, ends: dict[TopicPartition, int], timeout: float,
          ) -> tuple[float, float]:
    """From the worker's assignment until it has committed every record in `ends`:
    (wall s, the worker's CPU s)."""
    worker.wait_assigned(timeout)
    wall, cpu = time.perf_counter(), worker.cpu_seconds()
    total = sum(ends.values())
    admin = KafkaAdminClient(**client_kwargs(worker.settings.kafka))
    try:
        worker._poll(lambda: worker.committed(admin, ends) >= total, timeout,
                     f"commit of all {total} records", every=0.1)
    finally:
        admin.close()
    return time.perf_counter() - wall, worker.cpu_seconds() - cpu
