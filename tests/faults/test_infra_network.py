"""Infrastructure faults on the network between the workers and the broker (Toxiproxy).

A broker of this module's own (deploy/kafka/kafka.sh) has, besides its direct listener (for the
test's producer and reader), one listener per worker whose advertised address is a Toxiproxy
proxy in front of it: a worker that bootstraps through its proxy keeps talking through it, so a
toxic on that proxy hits that worker only. Two `fleetpulse worker` processes share the group.

Each scenario: the first part of the recording goes in, the fault starts, the second part goes
in during the fault, the fault heals, the third part goes in. The workers' actions, findings,
alerts and final node states must be the embedded runtime's for the same input (an
uninterrupted run); same-id repeats are counted, never a new id or a missing one. Time to
recover: from the heal until every expected output is out.

The partition holds one worker off the broker past the session timeout: its partitions move to
the other, it comes back (its late writes land then), and the other is then stopped so the
healed one recovers every table from the changelogs — a stale write of the fenced-off worker
there would fork the node states that the third part then shows.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, Settings, load_settings
from pipeline.model import Event
from pipeline.wire.topics import topic_name
from streams.testing import WorkerProcess, create_topics, produce_events, scenario, worker_env
from tests.faults import reliability
from tests.faults.judge import Expected, Seen, inputs_consumed, wait_owned
from tests.faults.toxiproxy import Toxiproxy, server

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[2]
KAFKA_SCRIPT = ROOT / "deploy" / "kafka" / "kafka.sh"
WORKERS = ("w1", "w2")  # one proxy and one broker listener each
SESSION_TIMEOUT_S = 6  # worker_env's, the broker's minimum
PARTS_MS = (420_000, 840_000)  # event-time ends of the first and second parts


def _free_ports(count: int) -> list[int]:
    """`count` distinct free ports; the first one's successor is free too (the controller)."""
    for _ in range(50):
        held: list[socket.socket] = []
        try:
            for _ in range(count + 1):
                sock = socket.socket()
                sock.bind(("127.0.0.1", 0))
                held.append(sock)
            ports = [int(s.getsockname()[1]) for s in held]
            with socket.socket() as controller:
                controller.bind(("127.0.0.1", ports[0] + 1))
            if ports[0] + 1 not in ports:
                return ports[:count]
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError("no free ports")


def _kafka(command: str, port: int, proxied: str) -> None:
    env = {**os.environ, "KAFKA_PORT": str(port), "KAFKA_PROXIED_LISTENERS": proxied}
    done = subprocess.run(["bash", str(KAFKA_SCRIPT), command], env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, f"kafka.sh {command}: {done.stdout}{done.stderr}"


@dataclass(frozen=True)
class Net:
    bootstrap: str  # direct: the test's producer and reader
    proxies: dict[str, int]  # worker name -> its proxy's port (its bootstrap)
    toxi: Toxiproxy


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    """Toxiproxy with a proxy per worker, and a broker advertising those proxies."""
    broker, api, *ports = _free_ports(2 + 2 * len(WORKERS))
    listens, fronts = ports[: len(WORKERS)], ports[len(WORKERS):]
    server(api, "start")
    toxi = Toxiproxy(api)
    proxied = " ".join(f"{w.upper()}={lp}:{fp}" for w, lp, fp in zip(WORKERS, listens, fronts,
                                                                       strict=True))
    try:
        for name, listen, front in zip(WORKERS, listens, fronts, strict=True):
            toxi.proxy(name, front, listen)
        _kafka("start", broker, proxied)
        try:
            yield Net(f"127.0.0.1:{broker}", dict(zip(WORKERS, fronts, strict=True)), toxi)
        finally:
            _kafka("reset", broker, proxied)
            for leftover in (ROOT / ".cache" / "kafka").glob(f"*-{broker}.*"):
                leftover.unlink()
    finally:
        server(api, "stop")


@dataclass
class Run:
    """One scenario's workers and what they are judged against."""

    net: Net
    settings: Settings
    workers: dict[str, WorkerProcess]
    seen: Seen
    findings_topic: str
    consumed: dict[str, int]  # input records each worker consumed, read before it stops


Fault = Callable[[Run], tuple[float, dict[str, float | str]]]  # -> heal time, extra figures


def _settings(bootstrap: str) -> Settings:
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                          partitions=3)
    return msgspec.structs.replace(load_settings(environ={}), kafka=kafka)


def _parts(start_ms: int, events: list[Event]) -> list[list[Event]]:
    parts: list[list[Event]] = [[], [], []]
    for event in events:
        at = getattr(event, "ts", 0) - start_ms
        parts[sum(at >= end for end in PARTS_MS)].append(event)
    return parts


def _wait_split(workers: list[WorkerProcess], topic: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        owned = [w.assignment().get(topic, set()) for w in workers]
        if all(owned) and not owned[0] & owned[1] and len(owned[0] | owned[1]) == 3:
            return
        assert time.monotonic() < deadline, f"no split assignment of {topic}: {owned}"
        time.sleep(0.3)


def _run(net: Net, tmp_path: Path, name: str, fault: Fault) -> None:
    """The three-part scenario around `fault` (which returns when it has healed)."""
    settings = _settings(net.bootstrap)
    sim = scenario()
    events = list(sim.events())
    want = Expected.of(settings, events)
    assert want.actions and want.findings
    parts = _parts(sim.start_ms, events)
    create_topics(worker_env(settings, tmp_path / "admin"))
    workers = {
        w: WorkerProcess(worker_env(settings, tmp_path / w, FLEETPULSE_KAFKA__BOOTSTRAP=
                                    f"127.0.0.1:{net.proxies[w]}"), tmp_path / f"{w}.log").start()
        for w in WORKERS
    }
    seen = Seen.open(settings, net.bootstrap)
    run = Run(net, settings, workers, seen, topic_name(settings.kafka, "findings"), {})
    try:
        _wait_split(list(workers.values()), run.findings_topic, timeout=150)
        print(f"{time.monotonic():.1f} split; producing part 1", flush=True)
        produce_events(settings, parts[0])
        seen.reader.until(lambda: bool(seen.actions()), 120, "the first part's first action")
        started = time.monotonic()
        produce_events(settings, parts[1])  # while the fault is on, below
        print(f"{time.monotonic():.1f} fault on", flush=True)
        healed, extra = fault(run)
        print(f"{healed:.1f} healed", flush=True)
        produce_events(settings, parts[2])
        seen.wait_complete(want, timeout=150)
        recovered_s = time.monotonic() - healed
        time.sleep(3)  # late repeats, if any, are judged too
        seen.reader.poll()
        for w, worker in workers.items():
            if worker.proc is not None and worker.proc.poll() is None:
                run.consumed[w] = inputs_consumed(worker)
        codes = {w: worker.stop() for w, worker in workers.items()}
        figures = seen.figures(want)
        wrong = seen.same_decisions(want)
        differences = seen.differences(want)
    finally:
        seen.close()
        for worker in workers.values():
            worker.stop()
    reliability.record("infrastructure", name, {
        "in": len(events), "consumed": sum(run.consumed.values()), **figures,
        "fault_s": round(healed - started, 1), "recovery_s": round(recovered_s, 1),
        **extra,
    })
    assert codes == dict.fromkeys(WORKERS, 0), {w: workers[w].tail() for w in WORKERS}
    assert figures["lost"] == 0, repr(differences)
    assert figures["unexpected"] == 0, repr(differences)
    assert not wrong, f"repeats that are not the same decision: {wrong}"


def _hold(run: Run, seconds: float) -> None:
    """Let the fault stand, while both workers stay alive."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for w, worker in run.workers.items():
            assert worker.proc is not None and worker.proc.poll() is None, (w, worker.tail())
        time.sleep(0.3)


@pytest.mark.slow  # make faults (42 s); connection resets are make test's network scenario
@pytest.mark.timeout(600)
def test_500ms_latency_both_ways_on_every_worker(net: Net, tmp_path: Path) -> None:
    def fault(run: Run) -> tuple[float, dict[str, float | str]]:
        for w in WORKERS:
            run.net.toxi.both_ways(w, "latency", latency=500)
        _hold(run, 20)
        run.net.toxi.reset()
        return time.monotonic(), {}

    _run(net, tmp_path, "500 ms latency, client to broker", fault)


@pytest.mark.slow  # make faults; connection resets are make test's network scenario
@pytest.mark.timeout(600)
def test_a_stalled_connection_shorter_than_the_session_timeout(net: Net, tmp_path: Path) -> None:
    def fault(run: Run) -> tuple[float, dict[str, float | str]]:
        run.net.toxi.both_ways("w1", "timeout", timeout=0)  # nothing passes, nothing closes
        _hold(run, SESSION_TIMEOUT_S - 2)
        run.net.toxi.reset()
        return time.monotonic(), {}

    _run(net, tmp_path, "stalled connection 4 s (one worker)", fault)


@pytest.mark.timeout(600)
def test_connection_resets(net: Net, tmp_path: Path) -> None:
    def fault(run: Run) -> tuple[float, dict[str, float | str]]:
        for _ in range(3):  # every connection of w1 reset, three times over ~9 s
            run.net.toxi.toxic("w1", "reset_peer", "upstream", timeout=0)
            _hold(run, 1)
            run.net.toxi.reset()
            _hold(run, 2)
        return time.monotonic(), {}

    _run(net, tmp_path, "connection resets x3 (one worker)", fault)


@pytest.mark.slow  # make faults
@pytest.mark.timeout(600)
def test_a_worker_partitioned_past_the_session_timeout(net: Net, tmp_path: Path) -> None:
    def fault(run: Run) -> tuple[float, dict[str, float | str]]:
        w1, w2 = run.workers["w1"], run.workers["w2"]
        cut = time.monotonic()
        run.net.toxi.both_ways("w1", "timeout", timeout=0)
        takeover_s = wait_owned(w2, run.findings_topic, {0, 1, 2}, timeout=90)
        _hold(run, max(0.0, 2 * SESSION_TIMEOUT_S - (time.monotonic() - cut)))
        mark = len(w1.output())
        run.net.toxi.reset()
        healed = time.monotonic()
        # the healed worker rejoins and takes its share back, then the other leaves: the
        # healed one recovers every table from the changelogs its late writes went to
        w1.wait_for(r"^fleetpulse worker: assigned", timeout=120, start=mark)
        rejoin_s = time.monotonic() - healed
        mark = len(w1.output())
        run.consumed["w2"] = inputs_consumed(w2)
        assert w2.stop() == 0, w2.tail()
        wait_owned(w1, run.findings_topic, {0, 1, 2}, timeout=120, after=mark)
        return healed, {"takeover_s": round(takeover_s, 1), "rejoin_s": round(rejoin_s, 1)}

    _run(net, tmp_path, "one worker partitioned 12 s (> session timeout), healed", fault)
