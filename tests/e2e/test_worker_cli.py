"""`fleetpulse worker` as an operator meets it: help, refusals that say what to do, a startup
line, and a clean stop on SIGTERM that commits what it processed and leaves the group."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import msgspec
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from pipeline.config import KafkaSettings, Settings, load_settings
from pipeline.wire.topics import topic_name
from streams.testing import WorkerProcess, create_topics, produce_events, scenario, worker_env


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env=env or {**os.environ},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _settings() -> Settings:
    bootstrap = os.environ.get("FLEETPULSE_KAFKA__BOOTSTRAP", "127.0.0.1:19092")
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        pytest.fail(
            f"Kafka is not reachable at {bootstrap} ({exc}); run the tests with `make test`"
        )
    kafka = KafkaSettings(
        bootstrap=bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=2
    )
    return msgspec.structs.replace(load_settings(environ={}), kafka=kafka)


def test_help_says_what_the_worker_does_and_needs() -> None:
    done = _cli("worker", "--help")
    assert done.returncode == 0, done.stderr
    for words in ("SIGTERM", "fleetpulse topics create", "consumer group", "--loglevel"):
        assert words in done.stdout
    assert "worker" in _cli("--help").stdout


def test_a_bad_setting_is_refused_by_name(tmp_path: Path) -> None:
    env = {**os.environ, "FLEETPULSE_WORKER__SESSION_TIMEOUT_S": "1"}
    done = _cli("worker", env=env)
    assert done.returncode == 2
    assert "worker.session_timeout_s" in done.stderr


@pytest.mark.kafka
def test_missing_topics_are_named_with_the_fix(tmp_path: Path) -> None:
    env = worker_env(_settings(), tmp_path)
    done = _cli("worker", env=env)
    assert done.returncode == 2
    assert "does not exist" in done.stderr and "fleetpulse topics create" in done.stderr
    assert env["FLEETPULSE_KAFKA__TOPIC_PREFIX"] + ".telemetry.gpu" in done.stderr
    # the inventory is enforced by default: nothing to warn about; switched off, it says
    # first that telemetry names the pools
    assert "no inventory" not in done.stderr, done.stderr
    loose = _cli("worker", env={**env, "FLEETPULSE_INVENTORY__ENFORCE": "false"})
    assert loose.returncode == 2
    assert loose.stderr.startswith("fleetpulse worker: no inventory enforced"), loose.stderr


@pytest.mark.kafka
def test_sigterm_stops_cleanly_after_committing_what_was_processed(tmp_path: Path) -> None:
    settings = _settings()
    env = worker_env(settings, tmp_path)
    create_topics(env)
    worker = WorkerProcess(env, tmp_path / "worker.log").start()
    try:
        startup = worker.wait_for(r"fleetpulse worker: broker=(\S+) group=(\S+) .*metrics=", 60)
        assert startup.group(1) == settings.kafka.bootstrap
        worker.wait_for(r"fleetpulse worker: assigned .*telemetry\.gpu=0,1", 120)
        print(f"worker assigned {time.monotonic() - worker.started_at:.1f}s after start")
        events = [e for e in scenario().events() if getattr(e, "ts", 0) < 1_767_225_660_000]
        produce_events(settings, events)
        gpu = topic_name(settings.kafka, "telemetry.gpu")
        ends = _end_offsets(settings, gpu)
        _wait_for_processed(worker, sum(ends.values()), gpu)
    finally:
        stopped_at = time.monotonic()
        code = worker.stop(timeout=60)
    assert code == 0, worker.tail()
    assert time.monotonic() - stopped_at < 30
    assert "fleetpulse worker: stopped (exit 0)" in worker.output()
    # everything it processed is committed: a successor starts where it stopped
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap)
    try:
        committed = admin.list_group_offsets({startup.group(2): None})[startup.group(2)]
    finally:
        admin.close()
    assert {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == gpu} == ends


def _end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap)
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def _wait_for_processed(worker: WorkerProcess, count: int, topic: str) -> None:
    url = f"http://127.0.0.1:{worker.metrics_port()}/metrics"
    deadline = time.monotonic() + 120
    while True:
        with urllib.request.urlopen(url, timeout=10) as response:
            lines = response.read().decode().splitlines()
        seen = sum(
            float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith("fleetpulse_worker_records_in_total{") and f'"{topic}"' in line
        )
        if seen >= count:
            return
        assert time.monotonic() < deadline, f"{seen} of {count} records read:\n{worker.tail()}"
        time.sleep(0.3)
