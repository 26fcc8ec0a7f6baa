"""The FleetPulse processes the chart's PrometheusRule and Grafana dashboard watch, running for
real and scraped by a real Prometheus (deploy/prometheus/prometheus.sh, 1 s scrapes): a
`fleetpulse worker` on the test broker working off the worker tests' small fleet (faults
included) and a dead letter, and `fleetpulse actuate kubernetes` on the test API server
carrying out a cordon. Shared by test_rules_promtool.py and test_dashboard_queries.py (one
start per session, through tests/integration/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kafka import KafkaProducer

from pipeline.config import KafkaSettings, load_settings
from pipeline.wire import codec
from pipeline.wire.topics import topic_name
from streams.testing import (
    WorkerProcess,
    announced_port,
    create_topics,
    metric_sum,
    produce_events,
    scenario,
    topic_of,
    worker_env,
)
from tests.integration.test_kubernetes_actuator import CLUSTER, action
from tests.kube_fixture import REPO, Kube

PROMETHEUS_SH = REPO / "deploy" / "prometheus" / "prometheus.sh"
# the job label each process gets, as the chart's ServiceMonitor names them (fleetpulse-...)
JOBS = {"worker": "fleetpulse-worker", "actuator": "fleetpulse-actuator"}


@dataclass
class Scraped:
    ports: dict[str, int]  # process -> its /metrics port
    prometheus: str  # base URL

    def metrics(self, process: str) -> str:
        url = f"http://127.0.0.1:{self.ports[process]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text: str = answer.read().decode()
        return text

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (an error answer fails the test)."""
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _settings(bootstrap: str) -> Any:
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                          partitions=2)  # fmt: skip
    return msgspec.structs.replace(load_settings(environ={}), kafka=kafka)


@pytest.fixture(scope="session")
def fleet_scraped(tmp_path_factory: pytest.TempPathFactory, kube: Kube) -> Iterator[Scraped]:
    work = tmp_path_factory.mktemp("fleet-scraped")
    settings = _settings(os.environ.get("FLEETPULSE_KAFKA__BOOTSTRAP", "127.0.0.1:19092"))
    env = worker_env(settings, work)
    create_topics(env)
    worker = WorkerProcess(env, work / "worker.log").start()
    actuator_log = work / "actuator.log"
    actuator = _start_actuator(env, kube, actuator_log)
    prometheus_env: dict[str, str] = {}
    try:
        ports = {"worker": worker.metrics_port(), "actuator": announced_port(actuator_log, actuator)}
        prometheus_env = _start_prometheus(work, ports)
        scraped = Scraped(ports, f"http://127.0.0.1:{prometheus_env['PROMETHEUS_PORT']}")
        _wait_until_up(scraped)
        worker.wait_for(r"fleetpulse worker: assigned .*telemetry\.gpu=0,1", 120)
        _drive(settings, kube, ports["worker"], worker)
        time.sleep(3)  # a few scrapes after the work: rates and increases see it
        yield scraped
    finally:
        if prometheus_env:
            subprocess.run(["bash", str(PROMETHEUS_SH), "stop"], env=prometheus_env,
                           check=False, timeout=60)  # fmt: skip
        actuator.terminate()
        actuator.wait(timeout=60)
        worker.stop(timeout=60)


def _start_actuator(env: dict[str, str], kube: Kube, log: Path) -> subprocess.Popen[bytes]:
    actuator_env = {**env, "FLEETPULSE_KUBERNETES__KUBECONFIG": kube.kubeconfig,
                    "FLEETPULSE_KUBERNETES__CLUSTER": CLUSTER,
                    "FLEETPULSE_KUBERNETES__GROUP_ID": f"act-{uuid.uuid4().hex[:8]}"}  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "actuate", "kubernetes"],
                                env=actuator_env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def _start_prometheus(work: Path, ports: dict[str, int]) -> dict[str, str]:
    targets = work / "targets.json"
    targets.write_text(json.dumps([
        {"targets": [f"127.0.0.1:{port}"], "labels": {"job": JOBS[name], "pod": f"{name}-0"}}
        for name, port in ports.items()]))  # fmt: skip
    env = {**os.environ, "PROMETHEUS_PORT": str(_free_port()),
           "PROMETHEUS_SCRAPE_INTERVAL": "1s", "PROMETHEUS_TARGETS": str(targets),
           "PROMETHEUS_CACHE_DIR": str(work / "prometheus")}  # fmt: skip
    subprocess.run(["bash", str(PROMETHEUS_SH), "start"], env=env, check=True, timeout=90)
    return env


def _wait_until_up(scraped: Scraped, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while {r["metric"]["job"] for r in scraped.query("up == 1")} != set(JOBS.values()):
        assert time.monotonic() < deadline, f"targets not up: {scraped.query('up')}"
        time.sleep(0.2)


def _drive(settings: Any, kube: Kube, worker_port: int, worker: WorkerProcess) -> None:
    """The worker's small fleet (findings, actions, alerts), one value it cannot decode (a
    dead letter), and one cordon for the actuator on a node of the test API server."""
    events = [e for e in scenario(duration_s=900).events()]
    produce_events(settings, events)
    producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    try:
        gpu = topic_name(settings.kafka, "telemetry.gpu")
        producer.send(gpu, key=b"bad", value=b'{"schema": "gpu_sample/9"}').get(timeout=30)
        node = kube.node()
        producer.send(topic_name(settings.kafka, "actions"), key=f"{CLUSTER}/{node}".encode(),
                      value=codec.encode(action(node))).get(timeout=30)  # fmt: skip
    finally:
        producer.close()
    sent = sum(1 for e in events if topic_of(settings, e) == gpu) + 1
    deadline = time.monotonic() + 90
    while (seen := metric_sum(worker_port, "fleetpulse_worker_records_in_total",
                              r"telemetry\.gpu")) < sent:  # fmt: skip
        lag = metric_sum(worker_port, "fleetpulse_worker_consumer_lag", "partition=")
        assert time.monotonic() < deadline, f"{seen} of {sent} read, lag {lag}\n{worker.tail()}"
        time.sleep(0.25)

