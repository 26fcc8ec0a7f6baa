"""Where the long-running processes listen, as an operator meets it: a second process on a
taken /metrics port stops at start with one line naming the port and the setting (exit 2, no
traceback, no silent move to another port); against the broker, /healthz and /readyz of the
worker and the lake sink."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import msgspec
import pytest

from pipeline.config import KafkaSettings, Settings, load_settings
from streams.testing import WorkerProcess, create_topics, worker_env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    answer: tuple[int, str] = (0, "")
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}"
        try:
            answer = _get(port, "/readyz")
        except OSError:  # not listening yet
            answer = (0, "not listening")
        if answer[0] == 200:
            return answer[1]
        time.sleep(0.5)
    raise AssertionError(f"/readyz never 200 within {timeout}s; last {answer}")


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    env.pop("FLEETPULSE_CONFIG", None)
    return env


def test_a_second_process_on_a_taken_port_exits_2_naming_port_and_setting(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:  # the first process's port
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(tmp_path)],
            env=_env(FLEETPULSE_METRICS__PORT=str(busy),
                     FLEETPULSE_KAFKA__BOOTSTRAP="127.0.0.1:1"),  # never reached
            capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
        )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert lines[0].startswith(f"fleetpulse: error: cannot listen on 0.0.0.0:{busy} ")
    assert "already in use" in lines[0] and "metrics.port" in lines[0]
    assert "FLEETPULSE_METRICS__PORT" in lines[0]


def _settings() -> Settings:
    bootstrap = os.environ.get("FLEETPULSE_KAFKA__BOOTSTRAP", "127.0.0.1:19092")
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        pytest.fail(f"Kafka is not reachable at {bootstrap} ({exc}); run with `make test`")
    kafka = KafkaSettings(
        bootstrap=bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=2
    )
    return msgspec.structs.replace(load_settings(environ={}), kafka=kafka)


@pytest.mark.kafka
def test_worker_and_lake_sink_answer_healthz_and_readyz(tmp_path: Path) -> None:
    settings = _settings()
    env = worker_env(settings, tmp_path / "worker")
    create_topics(env)
    worker_port, sink_port = _free_port(), _free_port()
    worker = WorkerProcess(
        {**env, "FLEETPULSE_METRICS__PORT": str(worker_port)}, tmp_path / "worker.log"
    ).start()
    sink = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(tmp_path / "lake")],
        env={**env, "FLEETPULSE_METRICS__PORT": str(sink_port),
             "FLEETPULSE_LAKE__GROUP_ID": f"lake-{uuid.uuid4().hex[:8]}"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        assert worker.metrics_port() == worker_port  # the configured port, not another
        assert _get(worker_port, "/healthz") == (200, "ok\n")
        assert "caught up" in _wait_ready(worker_port, worker.proc)  # type: ignore[arg-type]
        assert "fleetpulse_worker_records_in" in _get(worker_port, "/metrics")[1]
        assert "joined group lake-" in _wait_ready(sink_port, sink)
        assert _get(sink_port, "/healthz") == (200, "ok\n")
        # the sink's port is taken now: a second sink refuses to start, by name
        second = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "sink", "lake", "--lake", str(tmp_path)],
            env={**env, "FLEETPULSE_METRICS__PORT": str(sink_port)},
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert second.returncode == 2 and f":{sink_port} " in second.stderr, second.stderr
    finally:
        sink.terminate()
        sink.wait(60)
        assert worker.stop() == 0
