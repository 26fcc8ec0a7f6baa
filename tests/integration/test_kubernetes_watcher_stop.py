"""`fleetpulse watch kubernetes` as a pod lives (issue 34, item 5): SIGTERM stops it at once,
however long its watch would still block (watch_timeout_s 300, the default), and an API
server that is away is waited for with one line per try, never a traceback, until it is back
(a TCP forwarder to the real kube-apiserver that starts late stands for the server's return)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.config import KafkaSettings
from tests.kube_fixture import Kube

pytestmark = pytest.mark.kafka
CLUSTER = "c-stop"


def _watcher(kafka: KafkaSettings, kubeconfig: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
           "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
           "FLEETPULSE_METRICS__PORT": "0", "FLEETPULSE_KUBERNETES__KUBECONFIG": kubeconfig,
           "FLEETPULSE_KUBERNETES__CLUSTER": CLUSTER}  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "watch", "kubernetes"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def _wait_for(proc: subprocess.Popen[bytes], log: Path, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, text := log.read_text()):
        assert proc.poll() is None, f"the watcher exited ({proc.returncode}):\n{text}"
        assert time.monotonic() < deadline, f"no {pattern!r} after {timeout} s:\n{text}"
        time.sleep(0.1)
    return text


def _stop(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM; the seconds until it exited (0 expected)."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, code
    return time.monotonic() - sent


def test_sigterm_stops_a_watching_watcher_at_once(
    kafka_settings: KafkaSettings, kube: Kube, tmp_path: Path
) -> None:
    assert _fleetpulse_topics(kafka_settings) == 0
    log = tmp_path / "watcher.log"
    watcher = _watcher(kafka_settings, kube.kubeconfig, log)
    try:
        _wait_for(watcher, log, r"watching nodes from resourceVersion", 60)
        time.sleep(1)  # in the watch's blocking read
    finally:
        took = _stop(watcher)
    print(f"watcher stopped {took:.2f} s after SIGTERM")
    assert took < 3, log.read_text()
    assert "watcher: " in log.read_text() and "Traceback" not in log.read_text()


def test_an_api_server_away_is_waited_for_in_one_line_per_try(
    kafka_settings: KafkaSettings, kube: Kube, tmp_path: Path
) -> None:
    assert _fleetpulse_topics(kafka_settings) == 0
    port = _free_port()
    config = yaml.safe_load(Path(kube.kubeconfig).read_text())
    server = config["clusters"][0]["cluster"]["server"]
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    log = tmp_path / "watcher.log"
    watcher = _watcher(kafka_settings, str(kubeconfig), log)
    try:
        away = _wait_for(watcher, log, r"(?s)API server unreachable.*API server unreachable", 60)
        assert "Traceback" not in away, away
        # one line per try: ours, and nothing of the HTTP client's own retries
        tries = [line for line in away.splitlines() if f"port={port}" in line]
        assert all(re.search(r"API server unreachable: .*trying again in \d+ s$", line)
                   for line in tries), away  # fmt: skip
        with _forward(port, server.removeprefix("https://")):
            _wait_for(watcher, log, r"watching nodes from resourceVersion", 60)
            took = _stop(watcher)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert took < 3 and "Traceback" not in log.read_text(), log.read_text()


def _fleetpulse_topics(kafka: KafkaSettings) -> int:
    env = {**os.environ, "FLEETPULSE_KAFKA__BOOTSTRAP": kafka.bootstrap,
           "FLEETPULSE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "topics", "create"], env=env,
                          capture_output=True, timeout=120).returncode  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Forwarder:
    """A TCP forwarder from 127.0.0.1:port to `target` (host:port): the API server, back."""

    def __init__(self, port: int, target: str) -> None:
        host, _, target_port = target.rpartition(":")
        self.target = (host, int(target_port))
        self.listener = socket.create_server(("127.0.0.1", port))
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closed = True
        self.listener.close()


@contextlib.contextmanager
def _forward(port: int, target: str) -> Iterator[_Forwarder]:
    forwarder = _Forwarder(port, target)
    try:
        yield forwarder
    finally:
        forwarder.close()
