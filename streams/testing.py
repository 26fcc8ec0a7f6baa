"""Helpers for tests and benchmarks that drive `fleetpulse worker` as a real process.

A worker runs as a subprocess (so a test can SIGKILL it), configured by environment overrides
like any deployment; records go in and come out through kafka-python. Everything that waits
polls until a condition holds, with a deadline, and says what it saw when the deadline passes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import msgspec
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from pipeline.config import KafkaSettings, Settings, SimSettings
from pipeline.errors import DecodeError
from pipeline.model import Action, Event
from pipeline.runtime.embedded import EmbeddedRuntime
from pipeline.sim.engine import Simulation
from pipeline.sim.faults import ForcedFault
from pipeline.wire.batches import input_records, is_batch, partition_of, unpack
from pipeline.wire.codec import content_type_of, decode, encode_as, record_headers
from pipeline.wire.kafka import client_kwargs
from pipeline.wire.topics import TOPICS, record_key, topic_name

E = TypeVar("E", bound=Event)
# the topics an ingest adapter writes (the simulator also writes the fleet's inventory)
INPUT_SUFFIX = {
    spec.value: spec.suffix
    for spec in TOPICS
    if spec.suffix.startswith(("telemetry.", "events.")) or spec.suffix == "inventory"
}


def scenario(duration_s: int = 1200) -> Simulation:
    """The small fleet the worker tests run: 8 GPU nodes and a 16-chip TPU slice for 20
    minutes (or `duration_s`), with a lost GPU, an HBM failure, a dead ICI link and a user-XID
    confounder."""
    faults = [
        ForcedFault(fault_type="G1", at_s=200, target="fp-us-central1-h200-train-000"),
        ForcedFault(fault_type="G5", at_s=300, target="fp-us-east5-h100-train-000"),
        ForcedFault(fault_type="T2", at_s=250),
        ForcedFault(fault_type="J3", at_s=300),
    ]
    settings = SimSettings(
        seed=11,
        gpu_nodes=8,
        tpu_slices=1,
        tpu_slice_types=("v5litepod-16:4x4",),
        duration_s=duration_s,
        random_faults=False,
        diurnal=False,
    )
    return Simulation(settings, faults)


def security_env(kafka: KafkaSettings) -> dict[str, str]:
    """FLEETPULSE_KAFKA__* variables carrying `kafka`'s security settings to a child process."""
    names = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password",
             "sasl_password_file", "ssl_cafile", "ssl_certfile", "ssl_keyfile")
    env = {f"FLEETPULSE_KAFKA__{n.upper()}": getattr(kafka, n) for n in names if getattr(kafka, n)}
    env["FLEETPULSE_KAFKA__SSL_CHECK_HOSTNAME"] = str(kafka.ssl_check_hostname).lower()
    return env


def worker_env(settings: Settings, workdir: Path, **extra: str) -> dict[str, str]:
    """Environment for `python -m pipeline.cli worker` matching `settings`, fast failover."""
    k = settings.kafka
    env = {
        **os.environ,
        "FLEETPULSE_KAFKA__BOOTSTRAP": k.bootstrap,
        "FLEETPULSE_KAFKA__TOPIC_PREFIX": k.topic_prefix,
        "FLEETPULSE_KAFKA__PARTITIONS": str(k.partitions),
        "FLEETPULSE_METRICS__PORT": "0",
        "FLEETPULSE_WORKER__DATADIR": str(workdir),
        "FLEETPULSE_WORKER__SESSION_TIMEOUT_S": "6",  # the broker's minimum
        "FLEETPULSE_WORKER__HEARTBEAT_INTERVAL_S": "1",
        # Tests produce an hour of events in seconds: keep event-time order always, and wait
        # long enough for a producer's batch that a loaded 2-core machine held back.
        "FLEETPULSE_WORKER__ALIGN_ALWAYS": "true",
        "FLEETPULSE_WORKER__ALIGN_GRACE_MS": "2000",
        "PYTHONUNBUFFERED": "1",
        **security_env(k),
    }
    env.pop("FLEETPULSE_CONFIG", None)
    env.update(extra)
    return env


def create_topics(env: Mapping[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "topics", "create"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"topics create failed: {done.stdout}{done.stderr}")


@dataclass
class WorkerProcess:
    """One `fleetpulse worker` subprocess; its output goes to `log` (read back by the waits)."""

    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    _out: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> WorkerProcess:
        self._out = self.log.open("ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", "warning"],
            env=self.env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float, start: int = 0) -> re.Match[str]:
        """The first match of `pattern` in the output (after char `start`), polling."""
        regex = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.output(), start)
            if found is not None:
                return found
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"worker exited ({self.proc.returncode}):\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {timeout}s:\n{self.tail()}")
            time.sleep(0.2)

    def metrics_port(self, timeout: float = 60) -> int:
        return int(self.wait_for(r"metrics=http://[^:]+:(\d+)/metrics", timeout).group(1))

    def assignment(self) -> dict[str, set[int]]:
        """What the worker last said it owns: topic -> partitions."""
        lines = re.findall(r"^fleetpulse worker: assigned (.*)$", self.output(), re.M)
        if not lines or lines[-1] == "nothing":
            return {}
        owned: dict[str, set[int]] = {}
        for part in lines[-1].split():
            topic, _, partitions = part.partition("=")
            owned[topic] = {int(p) for p in partitions.split(",")}
        return owned

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop in time. Returns the exit code."""
        if self.proc is None:
            return 0
        code = stop_process(self.proc, timeout)
        if self._out is not None:
            self._out.close()
        return code

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """SIGTERM, wait; SIGKILL when it does not stop in time. The exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    return int(proc.returncode)


def topic_of(settings: Settings, event: Event) -> str:
    return topic_name(settings.kafka, INPUT_SUFFIX[type(event)])


def key_of(event: Event) -> str:
    """The key an ingest adapter gives an input event (see pipeline/wire/topics.py)."""
    return record_key(event)


def embedded_outputs(settings: Settings, events: Iterable[Event]) -> dict[str, list[Event]]:
    """What the embedded runtime makes of `events` when each is first encoded and decoded as
    the worker does (so an event the codec rejects is a dead letter in both runtimes)."""
    outputs: dict[str, list[Event]] = {}
    runtime = EmbeddedRuntime(settings, lambda s, e: outputs.setdefault(s, []).append(e))
    fmt = settings.kafka.telemetry_format
    for offset, event in enumerate(events):
        value, content_type = encode_as(event, fmt)
        runtime.feed_raw(INPUT_SUFFIX[type(event)], value, offset, key_of(event), content_type)
    return outputs


def producer(kafka: str | KafkaSettings) -> KafkaProducer:
    """A fast producer for tests; `kafka` is a bootstrap address or the settings (security)."""
    if isinstance(kafka, str):
        kafka = KafkaSettings(bootstrap=kafka)
    # gzip and big batches: kafka-python checksums in pure Python; fewer bytes, ~4x faster
    return KafkaProducer(
        **client_kwargs(kafka),
        linger_ms=20,
        acks="all",
        compression_type="gzip",
        batch_size=1024 * 1024,
    )


def produce_events(
    settings: Settings, events: Iterable[Event], kafka: KafkaProducer | None = None,
    batched: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Send input events to their topics, keyed and encoded as the ingest adapters do
    (`kafka.telemetry_format`); return the partition each key went to. The events of the
    topic suffixes in `batched` go as batch records (pipeline/wire/batches.py), one per partition
    and timestamp, as a producer batching each scrape would write them."""
    own = kafka is None
    kafka = kafka or producer(settings.kafka)
    futures = []
    scrape: list[Event] = []  # of a batched topic, one timestamp
    for event in [*events, None]:
        if scrape and (event is None or _scrape_of(event) != _scrape_of(scrape[0])):
            futures += _send_batches(kafka, settings, scrape)
            scrape = []
        if event is not None and INPUT_SUFFIX[type(event)] in batched:
            scrape.append(event)
        elif event is not None:
            futures.append((key_of(event), _send(kafka, settings, event)))
    kafka.flush()
    partitions = {key: fut.get(timeout=60).partition for key, fut in futures}
    if own:
        kafka.close()
    return partitions


def _scrape_of(event: Event) -> tuple[str, int]:
    return INPUT_SUFFIX[type(event)], int(getattr(event, "ts", 0))


def _send_batches(kafka: KafkaProducer, settings: Settings, events: list[Event]) -> list[Any]:
    batching = msgspec.structs.replace(settings.kafka, telemetry_batch=True)
    futures = []
    for record in input_records(events, batching):
        future = kafka.send(record.topic, key=record.key.encode(), value=record.value,
                            headers=record.headers, partition=record.partition)  # fmt: skip
        futures += [(key_of(e), future) for e in events
                    if partition_of(key_of(e), settings.kafka.partitions) == record.partition]
    return futures


def _send(kafka: KafkaProducer, settings: Settings, event: Event) -> Any:
    value, content_type = encode_as(event, settings.kafka.telemetry_format)
    return kafka.send(
        topic_of(settings, event),
        key=key_of(event).encode(),
        value=value,
        headers=record_headers(content_type),
    )


def payloads_of(record: Any) -> list[tuple[str | None, bytes]]:
    """A consumed record's values as (content type, bytes): a producer's batch record gives
    each of its values (pipeline/wire/batches.py), any other record its own (msgpack
    telemetry says so in its content-type header)."""
    if is_batch(record):
        return list(unpack(record.value))
    return [(content_type_of(record.headers), record.value)]


@dataclass
class TopicReader:
    """Reads topics from the beginning and keeps every record it has seen."""

    bootstrap: str
    topics: list[str]
    records: dict[str, list[Any]] = field(default_factory=dict)
    kafka: KafkaSettings | None = None  # security settings; None = plaintext to `bootstrap`

    def __post_init__(self) -> None:
        self._consumer = KafkaConsumer(
            **client_kwargs(self.kafka or KafkaSettings(bootstrap=self.bootstrap)),
            enable_auto_commit=False, consumer_timeout_ms=200
        )
        assigned = []
        for topic in self.topics:
            partitions = None
            deadline = time.monotonic() + 30
            while not partitions and time.monotonic() < deadline:
                partitions = self._consumer.partitions_for_topic(topic)
                time.sleep(0 if partitions else 0.2)
            if not partitions:
                raise AssertionError(f"topic {topic} has no partitions")
            assigned += [TopicPartition(topic, p) for p in sorted(partitions)]
        self._consumer.assign(assigned)
        self._consumer.seek_to_beginning(*assigned)
        self.records = {topic: [] for topic in self.topics}

    def poll(self) -> None:
        for batch in self._consumer.poll(timeout_ms=200).values():
            for record in batch:
                self.records[record.topic].append(record)

    def until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                counts = {t: len(r) for t, r in self.records.items()}
                raise AssertionError(f"not within {timeout}s: {what} (records so far: {counts})")
            self.poll()

    def payloads(self, topic: str) -> list[tuple[str | None, bytes]]:
        """Each value of `topic` as (content type, bytes) (`payloads_of` each record)."""
        return [found for record in self.records[topic] for found in payloads_of(record)]

    def values(self, topic: str, cls: type[E]) -> list[E]:
        """The values of `topic` that are `cls` values (a test's own poison is left out)."""
        values = []
        for content_type, raw in self.payloads(topic):
            with contextlib.suppress(DecodeError):
                values.append(decode(raw, cls, content_type=content_type))
        return values

    def close(self) -> None:
        self._consumer.close()


def announced_port(log: Path, process: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """The port a FleetPulse process (started with metrics.port 0) says it serves /readyz on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"/readyz on http://[^:]+:(\d+)", log.read_text(errors="replace"))
        if found:
            return int(found[1])
        assert process.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"the process never said where /readyz is:\n{log.read_text()[-3000:]}")


def metric_sum(port: int, name: str, labels: str = "") -> float:
    """Sum of the labelled samples of one /metrics family whose line matches the regex
    `labels` (a topic, a reason, ...)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith(name + "{") and re.search(labels, line))


def wait_worked_off(port: int, inputs: str, sent: int, *, timeout: float, quiet_s: float,
                    outputs: Callable[[], int] | None = None, why: Callable[[], str] = str) -> None:
    """Until the worker on `port` consumed `sent` records of the topics matching `inputs` (its
    own counter) and then stayed quiet for `quiet_s`: no lag on any partition (internal topics
    included) and, when given, `outputs()` no longer growing. `why()` goes with a timeout."""
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    seen = -1
    while True:
        now = time.monotonic()
        assert now < deadline, f"{sent} inputs not worked off in {timeout:.0f} s\n{why()}"
        consumed = metric_sum(port, "fleetpulse_worker_records_in_total", inputs)
        lag = metric_sum(port, "fleetpulse_worker_consumer_lag", "partition=")
        produced = outputs() if outputs is not None else 0
        if consumed < sent or lag > 0 or produced != seen:
            quiet_since, seen = None, produced
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since > quiet_s:
            return
        time.sleep(0.25)


def side_by_side(kafka: list[Action], embedded: list[Action]) -> str:
    """Two runtimes' actions, one per line in time order, for an assertion's message."""

    def lines(actions: list[Action]) -> str:
        return "\n".join(
            f"  {a.action_id} {a.ts} {a.kind:14} {a.target.kind} {a.target.name} "
            f"dry_run={a.dry_run} {a.reason.summary[:80]}"
            for a in sorted(actions, key=lambda a: (a.ts, a.action_id))
        )

    return f"\nkafka:\n{lines(kafka)}\nembedded:\n{lines(embedded)}"
