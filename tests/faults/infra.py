"""The harness of the infrastructure fault scenarios: a broker of the test's own (started and
stopped by deploy/kafka/kafka.sh), FleetPulse processes as subprocesses, /readyz polling, a
webhook receiver for the alerts process, a kernel log for the xid adapter, and counting by id.

Every process gets FLEETPULSE_METRICS__PORT=0 and says where its /readyz is; tests poll it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pipeline.lake.writer import visible_files
from pipeline.model import XidEvent
from pipeline.sim.endpoints.kernel_log import KernelLogWriter
from streams.testing import stop_process

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "kafka" / "kafka.sh"
XID_NODE = "fault-gpu-node-1"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def free_port_pair() -> int:
    """A port whose successor (the controller's) is free too; FAULTS_BROKER_PORT
    names one instead (a helper with ports of its own)."""
    if os.environ.get("FAULTS_BROKER_PORT"):
        return int(os.environ["FAULTS_BROKER_PORT"])
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port >= 65535:
            continue
        with socket.socket() as second:
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two free consecutive ports")


def broker(port: int, command: str) -> None:
    # a loaded 2-core machine can take more than the script's default 90 s to start a broker
    env = {"KAFKA_START_TIMEOUT": "240", **os.environ, "KAFKA_PORT": str(port)}
    done = subprocess.run(["bash", str(SCRIPT), command], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, f"kafka.sh {command}: {done.stdout}{done.stderr}"


@dataclass
class Broker:
    """A broker of one test's own: `stop()` and `start()` it; wiped afterwards."""

    port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        broker(self.port, "stop")

    def start(self) -> None:
        broker(self.port, "start")


@pytest.fixture
def own_broker() -> Iterator[Broker]:
    port = free_port_pair()
    broker(port, "start")
    try:
        yield Broker(port)
    finally:
        broker(port, "reset")  # stop, and remove its data dir
        for leftover in (ROOT / ".cache" / "kafka").glob(f"*-{port}.*"):
            leftover.unlink()  # its logs and properties: a new port each run


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Proc:
    """One FleetPulse command as a subprocess, its output in `log`."""

    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    port: int | None = None
    _mark: int = 0  # where this run's output starts in the log (a restart appends)

    def start(self) -> Proc:
        self._mark = len(self.text())
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *self.args],
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.port = None
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, chars: int = 3000) -> str:
        return f"--- {self.name} ---\n{self.text()[-chars:]}"

    def readyz_port(self, timeout: float = 60) -> int:
        """The /readyz port the process announced (the worker says metrics=...)."""
        import re

        deadline = time.monotonic() + timeout
        while self.port is None:
            found = re.search(r"(?:/readyz on |metrics=)http://[^:]+:(\d+)",
                              self.text()[self._mark :])
            if found:
                self.port = int(found[1])
                break
            assert self.alive(), self.tail()
            assert time.monotonic() < deadline, f"no /readyz port\n{self.tail()}"
            time.sleep(0.2)
        return self.port

    def ready(self) -> bool:
        return ready(self.readyz_port())

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, wait; SIGKILL when it does not stop. The exit code."""
        if self.proc is None:
            return 0
        return stop_process(self.proc, timeout)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return int(self.proc.wait(timeout))


def base_env(bootstrap: str, prefix: str, workdir: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "FLEETPULSE_KAFKA__BOOTSTRAP": bootstrap,
        "FLEETPULSE_KAFKA__TOPIC_PREFIX": prefix,
        "FLEETPULSE_KAFKA__PARTITIONS": "3",
        "FLEETPULSE_METRICS__PORT": "0",
        "FLEETPULSE_WORKER__DATADIR": str(workdir / "worker"),
        "FLEETPULSE_WORKER__SESSION_TIMEOUT_S": "6",
        "FLEETPULSE_WORKER__HEARTBEAT_INTERVAL_S": "1",
        "FLEETPULSE_WORKER__ALIGN_ALWAYS": "true",
        "FLEETPULSE_WORKER__ALIGN_GRACE_MS": "2000",
        "FLEETPULSE_LAKE__GROUP_ID": f"lake-{uuid.uuid4().hex[:8]}",
        "FLEETPULSE_LAKE__SESSION_TIMEOUT_S": "6",
        "FLEETPULSE_LAKE__FLUSH_SECONDS": "2",
        "FLEETPULSE_ALERTS__GROUP_ID": f"alerts-{uuid.uuid4().hex[:8]}",
        "FLEETPULSE_SOURCES__STATE_DIR": str(workdir / "sources"),
        "FLEETPULSE_SOURCES__POLL_INTERVAL_S": "1",
        "FLEETPULSE_SOURCES__NODE": XID_NODE,
        "FLEETPULSE_SOURCES__CLUSTER": "c1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("FLEETPULSE_CONFIG", None)
    env.update(extra)
    return env


class Receiver:
    """A webhook endpoint for `fleetpulse alerts`: 200 to every POST, keeps the alerts."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with outer._lock:
                    outer.alerts.extend(body.get("alerts", []))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def keys(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter((a["fingerprint"], a["status"]) for a in self.alerts)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    yield got
    got.close()


def write_xids(log: Path, first: int, count: int) -> list[XidEvent]:
    """`count` Xid lines (numbered from `first`) appended to a kernel log; the events."""
    writer = KernelLogWriter(log, XID_NODE, boot_ms=T0 - 60_000)
    events = []
    for n in range(first, first + count):
        event = XidEvent(ts=T0 + 1000 * n, cluster="c1", node=XID_NODE, pool="p1", zone="z1",
                         pci_bus_id=f"0000:{0x18 + n % 8:02x}:00", xid=(13, 31, 43)[n % 3],
                         pid=4000 + n, process="train.py", message=f"event {n}",
                         source="kernel_log")
        writer.write_xid(event)
        events.append(event)
    writer.close()
    return events


def lake_values(lake: Path, table: str, columns: list[str]) -> Counter[tuple[Any, ...]]:
    """Rows per value of `columns` over every file a reader reads (stored rows, no views)."""
    seen: Counter[tuple[Any, ...]] = Counter()
    for path in visible_files(lake, table):
        data = pq.read_table(path, columns=columns, partitioning=None).to_pylist()
        seen.update(tuple(row[c] for c in columns) for row in data)
    return seen


def lake_rows(lake: Path, table: str) -> int:
    return sum(pq.read_metadata(path).num_rows for path in visible_files(lake, table))


def seeded_point(name: str, low: float, high: float) -> tuple[int, float]:
    """A random point in [low, high): the seed is FAULTS_SEED or drawn, and both are
    reported, so a failing run can be repeated."""
    seed = int(os.environ.get("FAULTS_SEED") or random.SystemRandom().randrange(10**6))
    return seed, round(random.Random(f"{seed}-{name}").uniform(low, high), 2)


def wait_until(condition: Any, timeout: float, what: str, *procs: Proc) -> float:
    """Poll `condition()` until true; the seconds it took. Fails if a process exited."""
    started = time.monotonic()
    while not condition():
        for proc in procs:
            assert proc.alive(), f"{proc.name} exited while waiting for {what}\n{proc.tail()}"
        assert time.monotonic() - started < timeout, (
            f"not within {timeout}s: {what}\n" + "\n".join(p.tail(1500) for p in procs))
        time.sleep(0.3)
    return time.monotonic() - started


@dataclass
class Outage:
    """What the processes said while the broker was away."""

    unready: dict[str, bool] = field(default_factory=dict)

    def watch(self, procs: list[Proc], seconds: float, ready_of: list[Proc]) -> float:
        """At least `seconds`, and until each of `ready_of` has said it is not ready (a slow
        start on a loaded machine): every process stays up. The seconds watched."""
        started = time.monotonic()
        until = started + seconds
        while time.monotonic() < until or not all(self.unready.get(p.name) for p in ready_of):
            assert time.monotonic() - started < seconds + 120, (self.unready, [
                p.tail(1500) for p in ready_of])
            for proc in procs:
                assert proc.alive(), f"{proc.name} exited while the broker was away\n" \
                    + proc.tail()
            for proc in ready_of:
                if proc.port is not None or _announced(proc):
                    was = self.unready.get(proc.name, False)
                    self.unready[proc.name] = was or not proc.ready()
            time.sleep(0.5)
        return time.monotonic() - started


def _announced(proc: Proc) -> bool:
    with contextlib.suppress(AssertionError):
        proc.readyz_port(timeout=0.01)
        return True
    return False
