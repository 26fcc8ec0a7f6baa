"""The Helm chart as the test harness: the loop a cluster runs, from the chart's own render.

`helm template` with ci/harness-values.yaml renders the release; its RBAC and ServiceAccounts
go to the real k8s-apiserver, and each FleetPulse container it renders runs as a local
process exactly as rendered (tests/e2e/chart_pods.py: argv, environment, the pod's files at
their mount paths; the ServiceAccount token is one the API server issued, so the watcher and
the actuator run with the chart's RBAC): the topics Job first, as Helm's pre-install hook,
then the worker, the watcher, the actuator and the lake sink against the real broker.

The cluster has four GPU nodes, the simulator's inventory as Node objects. The watcher
publishes them as the inventory the worker's budgets count; the simulator's telemetry flows
on the wall clock (its last minute at once, then each 2 s tick when due), with a lost GPU
(XID 79) on two nodes. On the first, two pods under a PodDisruptionBudget that allows one
disruption at a time and a DaemonSet's pod: the worker cordons and drains it, the actuator
cordons, taints, sets the condition and evicts through the Eviction API, one pod per
budget; the test plays the kubelet (an evicted pod is deleted) and the disruption controller
(the budget allows one again once the pod is gone), so drained means the pods are gone. The
worker asks for a repair, the test plays the repair controller (it removes the label), the
watcher reports the node repaired, and after probation the node is back in service. On the
second, the budget allows nothing and a person uncordons the node while its drain waits: the
drain stops, FleetPulse's marks are cleared, and the node is not taken again. At the end every
process is stopped as a kubelet stops pods and must exit 0; the lake sink's volume then holds
the node's actions.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer

from pipeline.config import KafkaSettings
from pipeline.kube import nodes
from pipeline.wire.topics import topic_name
from tests.e2e.chart_pods import Container, Kubelet, render, workloads
from tests.e2e.chart_world import (
    CLUSTER,
    HISTORY_S,
    PERSONS_NODE,
    REPAIRED_NODE,
    World,
    create_nodes,
    fleet,
    ticks,
    workload,
)
from tests.faults.reliability import record
from tests.kube_fixture import Kube, helm, kube  # noqa: F401  (the session's fixtures)

HARNESS_VALUES = Path(__file__).resolve().parents[2] / "deploy/helm/fleetpulse/ci/harness-values.yaml"
UNCORDON = {"spec": {"unschedulable": False}}  # what `kubectl uncordon` sends
RUN_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
             "Secret", "ConfigMap"}  # fmt: skip  (what pods authenticate with or mount)


@dataclass
class Release:
    """The rendered release, its objects on the API server, its processes running."""

    k8s: Kube
    namespace: str
    kafka: KafkaSettings
    kubelet: Kubelet
    containers: dict[str, Container]
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # /metrics, /readyz
    nodes: list[str] = field(default_factory=list)  # cluster-wide: deleted at the end

    def start(self, key: str) -> None:
        self.procs[key] = self.containers[key].popen(self.log(key), self.kubelet.scratch)

    def port(self, component: str) -> int:
        (port,) = [p for key, p in self.ports.items() if key.endswith(f"-{component}")]
        return port

    def log(self, key: str) -> Path:
        return self.logs / f"{key.replace('/', '-')}.log"

    def tails(self) -> str:
        return "\n".join(f"--- {k}\n{self.log(k).read_text(errors='replace')[-2500:]}"
                         for k in self.procs)  # fmt: skip

    def stop(self) -> dict[str, tuple[int, float]]:
        """SIGTERM to every process, SIGKILL past its pod's grace period, as a kubelet stops
        pods: each one's exit status (-9: killed) and seconds to exit."""
        began = time.monotonic()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        stopped: dict[str, tuple[int, float]] = {}
        while len(stopped) < len(self.procs):
            for key, proc in self.procs.items():
                if key in stopped:
                    continue
                if proc.poll() is None and time.monotonic() > began + self.containers[key].grace_s:
                    proc.kill()
                    proc.wait()
                if proc.returncode is not None:
                    stopped[key] = (proc.returncode, round(time.monotonic() - began, 1))
            time.sleep(0.1)
        return stopped


def _api_port(k8s: Kube) -> int:
    server = yaml.safe_load(Path(k8s.kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    return int(server.rsplit(":", 1)[1])


@pytest.fixture
def release(helm: str, kube: Kube, tmp_path: Path) -> Iterator[Release]:  # noqa: F811
    from kubernetes import client
    from kubernetes.dynamic import DynamicClient

    k8s = kube
    hexed = uuid.uuid4().hex[:8]
    namespace, name = f"fp-harness-{hexed}", f"h{hexed}"
    bootstrap = os.environ.get("FLEETPULSE_KAFKA__BOOTSTRAP", "127.0.0.1:19092")
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"t{hexed}", partitions=2)
    docs = render(helm, name, namespace, "-f", str(HARNESS_VALUES), "--set",
                  f"kafka.bootstrap={bootstrap},kafka.topicPrefix={kafka.topic_prefix},"
                  f"cluster={CLUSTER}")  # fmt: skip
    k8s.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    # no controller manager: the namespace's default ServiceAccount, which pods need
    k8s.core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="default")))  # fmt: skip
    dynamic = DynamicClient(k8s.api_client)
    made = []
    for doc in (d for d in docs if d["kind"] in RUN_KINDS):
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        resource.create(body=doc, namespace=namespace if resource.namespaced else None)
        made.append((resource, doc["metadata"]["name"]))
    kubelet = Kubelet(k8s, namespace, _api_port(k8s), tmp_path / "pods")
    containers = {key: c for key, doc in workloads(docs).items()
                  for c in kubelet.containers(key, doc)}  # fmt: skip
    logs = tmp_path / "logs"
    logs.mkdir()
    running = Release(k8s, namespace, kafka, kubelet, containers, logs)
    try:
        yield running
    finally:
        running.stop()
        for node in running.nodes:
            k8s.core.delete_node(node)
        for resource, obj in made:
            if not resource.namespaced:
                resource.delete(name=obj)
        k8s.core.delete_namespace(namespace)
        _delete_topics(kafka)


def _delete_topics(kafka: KafkaSettings) -> None:
    """The release's topics (the topics Job made them): the broker outlives the test."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        mine = [t for t in admin.list_topics() if t.startswith(kafka.topic_prefix)]
        if mine:
            admin.delete_topics(mine, timeout_ms=30_000)
    finally:
        admin.close()


# --- reading the cluster -------------------------------------------------------------------


def _node(k8s: Kube, name: str) -> Any:
    return k8s.core.read_node(name)


def _outcomes(node: Any) -> set[str]:
    return set(json.loads((node.metadata.annotations or {}).get(nodes.ACTIONS, "{}")).values())


def _marks(node: Any) -> dict[str, Any]:
    conditions = {c.type: c.status for c in node.status.conditions or []}
    return {
        "unschedulable": bool(node.spec.unschedulable),
        "taint": any(t.key == nodes.TAINT_KEY for t in node.spec.taints or []),
        "condition": conditions.get(nodes.CONDITION),
        "cordoned_by": bool((node.metadata.annotations or {}).get(nodes.CORDONED_BY)),
    }


CORDONED = {"unschedulable": True, "taint": True, "condition": "True", "cordoned_by": True}
RELEASED = {"unschedulable": False, "taint": False, "condition": "False", "cordoned_by": False}


def _pods_left(k8s: Kube, namespace: str, node: str) -> list[str]:
    """The pods on `node` but the DaemonSet's."""
    pods = k8s.core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    return [p.metadata.name for p in pods
            if not any(o.kind == "DaemonSet" for o in p.metadata.owner_references or [])]  # fmt: skip


def _echoes(kafka: KafkaSettings) -> list[dict[str, Any]]:
    consumer = KafkaConsumer(topic_name(kafka, "events.node"), bootstrap_servers=kafka.bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=2000)  # fmt: skip
    try:
        return [json.loads(r.value) for r in consumer]
    finally:
        consumer.close()


def _unhealthy(kafka: KafkaSettings) -> set[tuple[str, str]]:
    """(check, target) of the unhealthy findings so far."""
    consumer = KafkaConsumer(topic_name(kafka, "findings"), bootstrap_servers=kafka.bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=500)  # fmt: skip
    try:
        found = [json.loads(r.value) for r in consumer]
    finally:
        consumer.close()
    return {(f["check"], f["entity"]["target"]["name"]) for f in found if not f["healthy"]}


def _inventory_keys(kafka: KafkaSettings) -> set[str]:
    consumer = KafkaConsumer(topic_name(kafka, "inventory"), bootstrap_servers=kafka.bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=1000)  # fmt: skip
    try:
        return {r.key.decode() for r in consumer if r.value}
    finally:
        consumer.close()


# --- the test ------------------------------------------------------------------------------


@dataclass
class Scene:
    """The cluster the release runs against."""

    names: dict[str, str]  # the simulator's node names -> this test's
    repaired: str  # the node lost a GPU: drained past its budget, repaired, released
    persons: str  # the node lost a GPU too: a person uncordons it during its drain
    evicted: list[str]  # the pods on `repaired`
    kept: list[str]  # the pods on `persons`
    budget: str  # the PodDisruptionBudget of `evicted`


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_the_charts_processes_close_the_loop_on_a_real_api_server(release: Release) -> None:
    began = time.monotonic()
    scene = _cluster(release)
    world = World(release, [], [], 0, 0, scene.budget)
    _install(release, world, began)
    world.until("the inventory published", lambda: {f"{CLUSTER}/{n}" for n in scene.names.values()}
                <= _inventory_keys(release.kafka), 60)  # fmt: skip
    ready_s = time.monotonic() - began
    _go_live(world, scene)
    try:
        figures = _the_loop(world, scene)
    finally:
        world.producer.close()
    stopped = _stop(release, scene)
    print(f"the chart's processes: {figures}, ready in {ready_s:.1f} s, "
          f"stopped in {stopped:.1f} s after SIGTERM")  # fmt: skip
    record("control", "the chart's processes: lost GPU cordoned, drained past a budget, "
           "repaired, released; a person's uncordon mid-drain wins", figures)  # fmt: skip


def _cluster(release: Release) -> Scene:
    """The simulator's GPU nodes as Node objects, pods and budgets on the two to fail."""
    k8s, namespace = release.k8s, release.namespace
    sim, names = fleet(namespace[-8:], 0)
    create_nodes(release, sim, names)
    repaired, persons = names[f"{CLUSTER}-{REPAIRED_NODE}"], names[f"{CLUSTER}-{PERSONS_NODE}"]
    evicted, budget = workload(k8s, namespace, repaired, "train-a", allowed=1)
    kept, _ = workload(k8s, namespace, persons, "train-b", allowed=0)
    return Scene(names, repaired, persons, evicted, kept, budget)


def _install(release: Release, world: World, began: float) -> None:
    """The topics Job to completion (Helm's pre-install hook), then every other container,
    each ready when its /readyz answers 200 (the readinessProbe), running as its pod's user."""
    (topics,) = [k for k in release.containers if k.startswith("Job/")]
    scheduled = [k for k in release.containers if k.startswith("CronJob/")]
    assert release.containers[topics].run(release.log(topics), release.kubelet.scratch, 120) == 0, \
        release.log(topics).read_text()  # fmt: skip
    print(f"topics created {time.monotonic() - began:.1f} s from the start")
    for key in release.containers:
        if key != topics and key not in scheduled:
            release.start(key)
    for key, proc in release.procs.items():
        port = release.ports[key] = _announced_port(release.log(key), proc)
        world.until(f"{key} ready", lambda p=port: _ready(p), 90)
        print(f"{key} ready {time.monotonic() - began:.1f} s from the start")
        run_as = release.containers[key].run_as
        if run_as is not None and os.geteuid() == 0:  # as the pod's user (chart_pods.py)
            assert _uid(proc.pid) == run_as[0], f"{key} runs as uid {_uid(proc.pid)}"


def _go_live(world: World, scene: Scene) -> None:
    """The telemetry: its last minute at once, then each tick when due; the faults 2 s on."""
    suffix = world.release.namespace[-8:]
    world.start_ms = int(time.time() * 1000) - HISTORY_S * 1000
    world.fault_ms = world.start_ms + (HISTORY_S + 2) * 1000
    world.ticks = ticks(fleet(suffix, world.start_ms)[0], scene.names)
    world.healthy = ticks(fleet(suffix, world.start_ms, faults=False)[0], scene.names)
    world.broken = {scene.repaired, scene.persons}
    world.producer = KafkaProducer(bootstrap_servers=world.release.kafka.bootstrap, acks="all")
    world.live = True


def _stop(release: Release, scene: Scene) -> float:
    """Every process stopped as a kubelet stops pods, each exiting 0 (the lake sink flushes);
    the lake's compaction CronJob run once (its schedule come) on the sink's volume; which
    holds the repaired node's actions. The slowest stop, in seconds."""
    stopped = release.stop()
    print(f"exit status and seconds after SIGTERM: {stopped}")
    assert all(code == 0 for code, _ in stopped.values()), \
        f"not every process exited 0 on SIGTERM within its grace period: {stopped}\n{release.tails()}"
    for key in (k for k in release.containers if k.startswith("CronJob/")):
        done = release.containers[key].run(release.log(key), release.kubelet.scratch, 120)
        out = release.log(key).read_text()
        assert done == 0 and re.search(r"^[1-9]\d* partitions: merged", out, re.M), out[-3000:]
    kinds = {a["kind"] for a in _lake_actions(release) if a["target_name"] == scene.repaired}
    assert {"cordon", "drain", "reboot", "uncordon"} <= kinds, kinds
    return max(seconds for _, seconds in stopped.values())


def _the_loop(world: World, scene: Scene) -> dict[str, Any]:
    """The faults, what the processes do about them and what the test plays (the person, the
    kubelet, the disruption and repair controllers); the seconds each step took."""
    release, repaired = world.release, scene.repaired
    world.until("the faults sent", lambda: world.fault_at, 30)
    world.until(f"{repaired} cordoned", lambda: _marks(_node(release.k8s, repaired)) == CORDONED, 30)
    cordon_s = time.monotonic() - world.fault_at
    released_s = _a_person_wins(world, scene)
    drained_s, label, back_s = _drained_repaired_released(world, scene)
    assert _marks(_node(release.k8s, scene.persons)) == RELEASED, "a person's uncordon was fought"
    assert sorted(_pods_left(release.k8s, release.namespace, scene.persons)) == sorted(scene.kept)
    echoes = [(e["kind"], e["target"], e.get("reason", "")) for e in _echoes(release.kafka)]
    assert any(kind == "skipped" and target == scene.persons and "during the drain" in why
               for kind, target, why in echoes), echoes  # fmt: skip
    assert ("repaired", repaired) in {(kind, target) for kind, target, _ in echoes}, echoes
    print(f"repair asked: {label}")
    return {"fault to cordon s": round(cordon_s, 2), "fault to drained s": round(drained_s, 2),
            "fault to back in service s": round(back_s, 2),
            "person's uncordon to released s": round(released_s, 2)}  # fmt: skip


def _a_person_wins(world: World, scene: Scene) -> float:
    """The person uncordons their node while its drain waits on the budget, once the fault has
    shown all it has (the lost GPU missing from the scrape: a check opening after a release is
    new evidence, and a new cordon would be right). Seconds until every mark is cleared."""
    release, persons = world.release, scene.persons
    world.until(f"{persons}'s drain refused by its budget",
                lambda: _metric(release.port("actuator"), "eviction_refusals") > 0, 30)
    world.until(f"{persons}'s GPU seen missing",
                lambda: ("gpu.missing", persons) in _unhealthy(release.kafka), 30)
    release.k8s.core.patch_node(persons, UNCORDON, _content_type="application/merge-patch+json")
    world.reboot(persons)  # the person fixed it
    person_at = time.monotonic()
    world.until(f"{persons} released", lambda: _marks(_node(release.k8s, persons)) == RELEASED, 30)
    return time.monotonic() - person_at


def _drained_repaired_released(world: World, scene: Scene) -> tuple[float, str, float]:
    """The repaired node drained (its pods gone), its repair asked for and done by the test as
    a repair controller, then back in service: seconds from the fault, and the repair."""
    k8s, repaired = world.release.k8s, scene.repaired
    world.until(f"{repaired} drained", lambda: "drained" in _outcomes(_node(k8s, repaired)) and not
                set(scene.evicted) & set(_pods_left(k8s, world.release.namespace, repaired)), 30)  # fmt: skip
    drained_s = time.monotonic() - world.fault_at
    label = world.until(f"{repaired}'s repair asked", lambda: (_node(k8s, repaired).metadata.labels
                        or {}).get(nodes.REPAIR_LABEL), 30)  # fmt: skip
    world.reboot(repaired)  # the repair controller reboots it, then takes its label off
    world.until(f"{repaired} rebooted", lambda: world.rebooted(repaired), 30)
    k8s.core.patch_node(repaired, {"metadata": {"labels": {nodes.REPAIR_LABEL: None}}},
                        _content_type="application/merge-patch+json")  # fmt: skip
    world.until(f"{repaired} back in service", lambda: _marks(_node(k8s, repaired)) == RELEASED, 45)
    return drained_s, str(label), time.monotonic() - world.fault_at


def _metric(port: int, name: str) -> float:
    """The sum of the samples of the /metrics families whose name holds `name`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if not line.startswith("#") and name in line.split("{")[0].split(" ")[0])  # fmt: skip


def _announced_port(log: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """The port a process started with metrics.port 0 says it serves /readyz on."""
    deadline = time.monotonic() + timeout
    while not (found := re.search(r"(?:/readyz on |metrics=)http://[^:]+:(\d+)",
                                  log.read_text(errors="replace"))):  # fmt: skip
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no port announced:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    return int(found[1])


def _lake_actions(release: Release) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    (lake,) = {m.source for c in release.containers.values() for m in c.mounts
               if m.path == "/lake"}  # fmt: skip  (the sink's claim, and the compaction's)
    return [row for path in sorted((lake / "actions").rglob("*.parquet"))
            for row in pq.read_table(path).to_pylist()]  # fmt: skip


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M)[1])  # type: ignore[index]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False
