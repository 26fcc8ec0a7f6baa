"""Infrastructure: a producer faster than the worker (backpressure).

Hours of a small fleet's telemetry are produced as fast as Kafka takes them, far faster than one
Python worker processes them. Meanwhile the worker's /metrics is read every half second: the
consumer lag must be reported, and what a backlog could make grow must stay bounded — records
the Aligners hold, decoded states cached, output batches waiting for the broker, resident
memory. Afterwards the worker catches up: no lag left, and its actions, findings, alerts and
final node states are the embedded runtime's for the same input.

The short version (in `make test`) produces an hour of the fleet at once; the slow one
(`make faults`) keeps producing for five minutes.
"""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, Settings, load_settings
from pipeline.model import Event
from pipeline.wire.topics import record_key, topic_name
from streams.acks import MAX_IN_FLIGHT
from streams.agents import ALIGN_MAX_HELD
from streams.testing import (
    WorkerProcess,
    create_topics,
    produce_events,
    producer,
    scenario,
    worker_env,
)
from tests.faults import reliability
from tests.faults.judge import Expected, Seen, inputs_consumed, wait_owned

pytestmark = pytest.mark.kafka
MIB = 1024 * 1024
RSS_LIMIT_MIB = 1024  # a worker of this small fleet stays far below; a leak per record does not


@dataclass
class Peaks:
    """The largest values /metrics showed while the backlog was worked off."""

    lag: float = 0
    held: float = 0
    cached: float = 0
    unsettled: float = 0
    rss_mib: float = 0
    samples: int = 0
    errors: list[str] = field(default_factory=list)

    def read(self, port: int) -> float:
        """Take one sample; returns the lag it showed."""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            lines = answer.read().decode().splitlines()
        values: dict[str, float] = {}
        held = 0.0
        for line in lines:
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            family = name.split("{", 1)[0]
            if family == "fleetpulse_worker_held_records":
                held = max(held, float(value))
            else:
                values[family] = values.get(family, 0.0) + float(value)
        lag = values.get("fleetpulse_worker_consumer_lag", 0.0)
        self.lag = max(self.lag, lag)
        self.held = max(self.held, held)
        self.cached = max(self.cached, values.get("fleetpulse_worker_cached_states", 0.0))
        self.unsettled = max(self.unsettled, values.get("fleetpulse_worker_unsettled_batches", 0))
        rss = values.get("fleetpulse_worker_process_resident_memory_bytes", 0.0) / MIB
        self.rss_mib = max(self.rss_mib, rss)
        self.samples += 1
        return lag


def _watch(port: int, peaks: Peaks, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            peaks.read(port)
        except OSError as exc:  # recorded: a worker that stops answering fails the test
            peaks.errors.append(repr(exc))
        stop.wait(0.5)


def _lag_gone(port: int, peaks: Peaks, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while peaks.read(port) > 0:
        assert time.monotonic() < deadline, f"lag {peaks.lag} not worked off in {timeout}s"
        time.sleep(0.5)


def _produce_for(settings: Settings, events: Iterator[Event], seconds: float) -> list[Event]:
    """Produce `events` in chunks of 2,000, as fast as Kafka takes them, for `seconds`;
    returns what was produced."""
    sent: list[Event] = []
    kafka = producer(settings.kafka)
    start = time.monotonic()
    try:
        while time.monotonic() - start < seconds:
            chunk = [e for _, e in zip(range(2000), events, strict=False)]
            if not chunk:
                break
            produce_events(settings, chunk, kafka)
            sent += chunk
    finally:
        kafka.close()
    return sent


def _backpressure(kafka_bootstrap: str, tmp_path: Path, name: str, duration_s: int,
                  produce_s: float, decisions: bool = True) -> None:
    """`decisions`: also require the embedded run's actions, alerts and node states (False
    only for the days of telemetry of the five-minute run, whose embedded reference is not
    worth its minutes)."""
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                          partitions=3)
    settings = msgspec.structs.replace(load_settings(environ={}), kafka=kafka)
    create_topics(worker_env(settings, tmp_path / "admin"))
    worker = WorkerProcess(worker_env(settings, tmp_path / "w1"), tmp_path / "w1.log").start()
    seen = Seen.open(settings, kafka_bootstrap)
    peaks, stop = Peaks(), threading.Event()
    try:
        wait_owned(worker, topic_name(kafka, "findings"), {0, 1, 2}, timeout=120)
        port = worker.metrics_port()
        rss_before = Peaks()
        rss_before.read(port)
        watcher = threading.Thread(target=_watch, args=(port, peaks, stop), daemon=True)
        watcher.start()
        began = time.monotonic()
        events = _produce_for(settings, iter(scenario(duration_s).events()), produce_s)
        produced = time.monotonic()
        want = Expected.of(settings, events)  # while the worker works the backlog off
        _lag_gone(port, peaks, timeout=1500)
        seen.wait_complete(want, timeout=120, decisions=decisions)
        caught_up_s = time.monotonic() - produced
        stop.set()
        watcher.join(10)
        consumed = inputs_consumed(worker)
        figures = seen.figures(want)
        if not decisions:  # only findings are judged: actions and alerts are not counted as lost
            figures = _findings_judged(figures, len(events) - consumed)
        wrong = seen.same_decisions(want)
        differences = seen.differences(want)
        assert worker.stop() == 0, worker.tail()
    finally:
        stop.set()
        seen.close()
        worker.stop()
    keys = len({record_key(e) for e in events})
    reliability.record("infrastructure", name, {
        "in": len(events), "consumed": consumed, **figures,
        "produce_s": round(produced - began, 1), "peak lag": int(peaks.lag),
        "peak held": int(peaks.held), "peak cached states": int(peaks.cached),
        "peak rss_mib": round(peaks.rss_mib), "rss_mib before": round(rss_before.rss_mib),
        "recovery_s": round(caught_up_s, 1),
    })
    assert not peaks.errors, peaks.errors[:3]
    assert peaks.samples > 3
    assert peaks.lag > 0, "the lag gauge never showed the backlog"
    assert peaks.held <= ALIGN_MAX_HELD + 1
    # one decoded state per key and table (telemetry, health, zone, policy) at most
    assert peaks.cached <= 4 * keys
    assert peaks.unsettled <= MAX_IN_FLIGHT + 2
    assert peaks.rss_mib < RSS_LIMIT_MIB
    assert figures["lost findings"] == 0
    assert figures["lost"] == 0, repr(differences)
    if decisions:
        assert figures["unexpected"] == 0, repr(differences)
        assert not wrong, f"repeats that are not the same decision: {wrong}"


def _findings_judged(figures: dict[str, int], unconsumed: int) -> dict[str, int]:
    """The figures of a run whose decisions are not judged: what was lost is findings and
    input; actions and alerts unlike the embedded run's are counted apart (over days of a
    fleet the zone and fleet caps bind, and the policy admits across partitions in arrival
    order: streams/README.md, known limits)."""
    unlike = figures["lost"] - figures["lost findings"] + figures["unexpected"]
    rest = {k: v for k, v in figures.items() if k not in ("lost", "unexpected")}
    return {**rest, "lost": figures["lost findings"] + max(0, unconsumed),
            "decisions unlike embedded (not judged)": unlike}


@pytest.mark.timeout(600)
def test_an_hour_produced_at_once_is_worked_off(kafka_bootstrap: str, tmp_path: Path) -> None:
    # an hour of backlog: our actions come back to the health machine many minutes of event
    # time after the findings they answer, and capacity readings reach the policy long before
    # the health machine's signals of the same moment; the decisions are the live ones anyway
    _backpressure(kafka_bootstrap, tmp_path, "backpressure: 1 h of telemetry at once",
                  duration_s=3600, produce_s=600)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_producer_faster_than_the_worker_for_five_minutes(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    # days of telemetry: memory, lag and findings are judged; decisions by the tests around it
    _backpressure(kafka_bootstrap, tmp_path, "backpressure: producing for 5 min",
                  duration_s=7 * 24 * 3600, produce_s=300, decisions=False)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_hours_of_backlog_decide_as_live(kafka_bootstrap: str, tmp_path: Path) -> None:
    # hours of backlog: the timed repairs (reset_gpu, reboot, repair_slice ~1 h after the
    # drain) and the uncordon after probation must come as live, though our actions come back
    # late
    _backpressure(kafka_bootstrap, tmp_path, "backpressure: 3 h of telemetry at once",
                  duration_s=3 * 3600, produce_s=600)
